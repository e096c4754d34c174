package native

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

// ownedParent returns a cgroup parent unique to this test process, for
// backends with OwnParent (which take a host-wide lock on it, sweep it and
// remove it on Close).
func ownedParent(t testing.TB, tag string) string {
	t.Helper()
	testutil.RequiresRoot(t)
	return testCgroupParent + "-" + tag + "-" + strconv.Itoa(os.Getpid())
}

func newOwnedBackend(t testing.TB, parent string) *Backend {
	t.Helper()
	b, err := New(Config{CgroupParent: parent, OwnParent: true, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// parentDirs returns the directories of the cgroup parent that exist.
func parentDirs(b *Backend, parent string) []string {
	var out []string
	for _, root := range b.hierarchyRoots() {
		if _, err := os.Stat(filepath.Join(root, parent)); err == nil {
			out = append(out, filepath.Join(root, parent))
		}
	}
	return out
}

// Two backends cannot own one parent; the owner's Close removes the parent
// once its last sandbox is gone, and leaves it while one lives.
func TestOwnedParentLockedAndRemoved(t *testing.T) {
	parent := ownedParent(t, "own")
	f := fixture(t)
	b := newOwnedBackend(t, parent)
	if _, err := New(Config{CgroupParent: parent, OwnParent: true, Logger: testLogger()}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a second owner of %s: err %v, want ErrUnavailable", parent, err)
	}
	spec := runtimetest.NewSpec(t, runtimetest.NewID("own"), f.Layer, f.RunnerDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if len(parentDirs(b, parent)) == 0 {
		t.Fatal("Close removed the parent of a live sandbox")
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := newOwnedBackend(t, parent) // Close released the lock
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if dirs := parentDirs(b2, parent); len(dirs) != 0 {
		t.Errorf("owned parent left after Close with no sandbox: %v", dirs)
	}
}

// A sandbox a daemon of an earlier version made under the shared legacy
// parent is recovered by a backend with a parent of its own, and cleaned
// up there when it cannot be.
func TestRecoverLegacyParent(t *testing.T) {
	f := fixture(t)
	legacy, err := New(Config{CgroupParent: LegacyCgroupParent, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	spec := runtimetest.NewSpec(t, runtimetest.NewID("legacy"), f.Layer, f.RunnerDir)
	sb := runtimetest.Create(t, legacy, spec)
	state := sb.State()

	b := newOwnedBackend(t, ownedParent(t, "legacy"))
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	sb2, err := b.Recover(ctx, spec, state)
	if err != nil {
		t.Fatalf("recovering a sandbox under /%s: %v", LegacyCgroupParent, err)
	}
	if out, _ := runtimetest.MustExec(t, sb2.SocketPath(), "echo legacy"); out != "legacy\n" {
		t.Errorf("exec in the recovered legacy sandbox: %q", out)
	}
	if err := b.Cleanup(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := loadCgroup(b.mode, legacyCgroupPath(spec.ID)); !errdefs.IsNotFound(err) {
		t.Errorf("legacy cgroup of %s left after Cleanup: %v", spec.ID, err)
	}
	select {
	case <-sb.Wait():
	case <-time.After(10 * time.Second):
		t.Error("the legacy sandbox's guest still runs after Cleanup")
	}
	// The recovering backend's pidfd watcher must be done too before the
	// test returns: it saw the guest exit.
	select {
	case <-sb2.Wait():
	case <-time.After(10 * time.Second):
		t.Error("the recovered sandbox's watcher did not see its guest exit after Cleanup")
	}
}
