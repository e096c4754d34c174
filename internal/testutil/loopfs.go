package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// LoopFS creates a file system of type fstype ("xfs" with reflink=1, or
// "btrfs") of sizeMiB in a sparse file, mounts it on a fresh directory
// (mode 0711) and returns that directory; it is unmounted and removed when
// t ends. It skips t unless it runs as root and mkfs.<fstype> exists (apt
// packages xfsprogs, btrfs-progs).
func LoopFS(t testing.TB, fstype string, sizeMiB int64) string {
	t.Helper()
	return loopFS(t, fstype, sizeMiB, "loop")
}

// XFSProjectQuotaFS is LoopFS of an XFS mounted with project quotas
// enforced (-o prjquota). A kernel built without XFS quota support
// (CONFIG_XFS_QUOTA unset: no /proc/fs/xfs/xqm) skips t even under
// AGENTBOX_TEST_STRICT=1, saying so: a kernel option is nothing
// install-deps.sh can install.
func XFSProjectQuotaFS(t testing.TB, sizeMiB int64) string {
	t.Helper()
	return loopFS(t, "xfs", sizeMiB, "loop,prjquota")
}

func loopFS(t testing.TB, fstype string, sizeMiB int64, opts string) string {
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
	if out, err := exec.Command("mount", "-o", opts, "-t", fstype, img, mnt).CombinedOutput(); err != nil {
		os.RemoveAll(base)
		if strings.Contains(opts, "prjquota") {
			if _, serr := os.Stat("/proc/fs/xfs/xqm"); serr != nil {
				t.Skipf("this kernel has no XFS quota support (CONFIG_XFS_QUOTA unset, no /proc/fs/xfs/xqm): cannot mount -o %s: %s", opts, out)
			}
		}
		skipf(t, "cannot loop-mount %s -o %s: %v: %s", fstype, opts, err, out)
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
