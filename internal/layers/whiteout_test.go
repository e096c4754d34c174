package layers

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyOwnsHostRootWhiteouts: a whiteout host root made (the gvisor
// backend's overlay) is taken into a layer as the map's root's; a regular
// file owned outside the map is still refused.
func TestCopyOwnsHostRootWhiteouts(t *testing.T) {
	s := newStore(t)
	src := t.TempDir()
	wo := filepath.Join(src, "gone")
	if err := unix.Mknod(wo, unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(wo, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(src, int(testIDs.HostID), int(testIDs.HostID)); err != nil {
		t.Fatal(err)
	}
	l, err := s.CreateFromCopy(context.Background(), src, CreateOptions{})
	if err != nil {
		t.Fatalf("CreateFromCopy with a host-root whiteout: %v", err)
	}
	paths, err := s.Paths(l.ID)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(paths[0], "gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != testIDs.HostID || st.Gid != testIDs.HostID {
		t.Errorf("whiteout in the layer owned by %d:%d, want %d", st.Uid, st.Gid, testIDs.HostID)
	}
	if fi, err := os.Lstat(wo); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the source was changed: %v", err)
	}

	bad := t.TempDir()
	if err := os.Chown(bad, int(testIDs.HostID), int(testIDs.HostID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFromCopy(context.Background(), bad, CreateOptions{}); err == nil {
		t.Error("a file owned by host root was taken into a layer")
	}
}
