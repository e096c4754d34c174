package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/testutil"
)

// mountedAt reports whether /proc/self/mountinfo lists a mount at dir.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// protectSandboxesDir's undo takes back the bind mount it made, and leaves
// alone one it found (a previous daemon's, kept for its sandboxes).
func TestProtectSandboxesDirUndo(t *testing.T) {
	testutil.RequiresRoot(t)
	data := t.TempDir()
	dir := filepath.Join(data, "sandboxes")
	undo, err := protectSandboxesDir(data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if ok, err := diskquota.IsMountPoint(dir); err != nil || !ok {
		t.Fatalf("sandboxes dir not a mount point after protect: %v %v", ok, err)
	}
	// A second daemon finds the mount: its undo keeps it.
	undo2, err := protectSandboxesDir(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := undo2(); err != nil || !mountedAt(t, dir) {
		t.Fatalf("undo of a found mount removed it (err %v)", err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, dir) {
		t.Fatalf("undo left the mount at %s", dir)
	}
}
