package native

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

// A zygote's log moves into a state dir on another filesystem (a sandbox
// with a loop disk quota) as a symlink to the log kept in the log dir;
// removeKeptLog, run by removeFiles, deletes the kept log; a state dir on
// the same filesystem gets the file itself.
func TestMoveLogAcrossFilesystems(t *testing.T) {
	testutil.RequiresRoot(t)
	logDir, other := t.TempDir(), t.TempDir()
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(other, unix.MNT_DETACH) })
	src := filepath.Join(logDir, zygotePrefix+"x.log")
	if err := os.WriteFile(src, []byte("started\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(other, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := runtime.Spec{ID: "sb1", StateDir: state}
	dst := filepath.Join(state, guestLogName)
	moved, err := moveLog(src, dst, spec.ID)
	if err != nil {
		t.Fatalf("moveLog across filesystems: %v", err)
	}
	if moved != filepath.Join(logDir, keptLogName("sb1")) {
		t.Fatalf("kept at %s", moved)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "started\n" {
		t.Fatalf("reading the log through %s: %q, %v", dst, b, err)
	}
	if err := removeFiles(spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(moved); !os.IsNotExist(err) {
		t.Fatalf("kept log survived removeFiles: %v", err)
	}

	// Same filesystem: a plain rename, nothing kept.
	same := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(same, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if moved, err := moveLog(src, filepath.Join(same, guestLogName), "sb2"); err != nil || moved != filepath.Join(same, guestLogName) {
		t.Fatalf("moveLog on one filesystem: %s, %v", moved, err)
	}
	if fi, err := os.Lstat(filepath.Join(same, guestLogName)); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("log on one filesystem: %v, %v", fi, err)
	}
}
