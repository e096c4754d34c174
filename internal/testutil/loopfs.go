package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// LoopFS creates a file system of type fstype ("xfs" with reflink=1, or
// "btrfs") of sizeMiB in a sparse file, mounts it on a fresh directory
// (mode 0711) and returns that directory; it is unmounted and removed when
// t ends. It skips t unless it runs as root and mkfs.<fstype> exists (apt
// packages xfsprogs, btrfs-progs).
func LoopFS(t testing.TB, fstype string, sizeMiB int64) string {
	t.Helper()
	RequiresRoot(t)
	mkfs := RequiresBinary(t, "mkfs."+fstype)
	base, err := os.MkdirTemp("", "abx-loop-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(base, "img")
	mnt := filepath.Join(base, "m")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(sizeMiB << 20)
		f.Close()
	}
	if err != nil {
		os.RemoveAll(base)
		t.Fatal(err)
	}
	args := []string{"-q", img}
	switch fstype {
	case "xfs":
		args = []string{"-q", "-m", "reflink=1", img}
	case "btrfs":
		args = []string{"-q", "-f", img}
	}
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		os.RemoveAll(base)
		t.Fatalf("mkfs.%s: %v\n%s", fstype, err, out)
	}
	if err := os.Mkdir(mnt, 0o711); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", "-t", fstype, img, mnt).CombinedOutput(); err != nil {
		os.RemoveAll(base)
		skipf(t, "cannot loop-mount %s: %v: %s", fstype, err, out)
	}
	if err := os.Chmod(mnt, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
			return
		}
		os.RemoveAll(base)
	})
	return mnt
}
