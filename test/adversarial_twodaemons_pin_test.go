package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	agentbox "github.com/agentbox/agentbox/sdk/go"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestAdversarialTwoDaemonsZygotesPinNoMounts: a mount made on the host
// before a daemon prespawned its guests, and unmounted after, is held by
// none of them (a waiting guest used to hold a private copy of the whole
// host mount table, pinning every mount of every other daemon).
func TestAdversarialTwoDaemonsZygotesPinNoMounts(t *testing.T) {
	testutil.RequiresRoot(t)
	mnt := filepath.Join("/tmp", "abx-pin-"+randHex(4))
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH); _ = os.Remove(mnt) })
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t)
	zygotes := waitZygotes(t, d, 2)
	if err := syscall.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmounting %s on the host: %v", mnt, err)
	}
	for pid := range zygotes {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
		if err != nil {
			t.Fatalf("zygote %d: %v", pid, err)
		}
		if strings.Contains(string(b), " "+mnt+" ") {
			t.Errorf("waiting guest %d still holds %s after the host unmounted it", pid, mnt)
		}
	}
	// The zygotes still make working sandboxes.
	sb := d.create(t, agentbox.SandboxSpec{})
	if out := mustRun(t, sb, "echo ok"); out != "ok\n" {
		t.Errorf("sandbox from a zygote: %q", out)
	}
}
