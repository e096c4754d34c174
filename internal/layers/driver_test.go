package layers

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// driverCase is one driver on one filesystem for the conformance suite.
type driverCase struct {
	name    string
	dir     func(t *testing.T) string // a directory on the filesystem
	want    string                    // driver name ProbeDriver must pick
	reflink bool
}

var driverCases = []driverCase{
	{name: "copy-tmp", dir: func(t *testing.T) string { return t.TempDir() }, want: ""},
	{name: "reflink-xfs", dir: func(t *testing.T) string { return testutil.LoopFS(t, "xfs", 512) }, want: "reflink", reflink: true},
	{name: "reflink-btrfs", dir: func(t *testing.T) string { return testutil.LoopFS(t, "btrfs", 512) }, want: "reflink", reflink: true},
}

// mkRichTree makes a tree with every kind of entry a layer holds, owned by
// mapped ids.
func mkRichTree(t *testing.T, root string) {
	t.Helper()
	mkTree(t, root) // dirs, file, hardlink, symlink, whiteout
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	must(os.WriteFile(filepath.Join(root, "etc/big"), big, 0o600))
	must(unix.Mkfifo(filepath.Join(root, "etc/fifo"), 0o640))
	must(unix.Lsetxattr(filepath.Join(root, "etc/sub"), xattrOpaque, []byte("y"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "etc/a"), "user.overlay.origin", []byte("x"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "etc/a"), "user.note", []byte("kept"), 0))
	must(filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 100001, 100002)
	}))
	must(unix.Chmod(filepath.Join(root, "etc/big"), 0o4751))
}

func TestDriverConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, c := range driverCases {
		t.Run(c.name, func(t *testing.T) {
			base := c.dir(t)
			d, err := ProbeDriver(base)
			if err != nil {
				t.Fatal(err)
			}
			if c.want != "" && d.Name() != c.want {
				t.Fatalf("ProbeDriver on %s = %s, want %s", d.Features().Filesystem, d.Name(), c.want)
			}
			if d.Features().Reflink != (d.Name() == "reflink") {
				t.Fatalf("features %+v of driver %s", d.Features(), d.Name())
			}
			src := filepath.Join(base, "src")
			mkRichTree(t, src)
			h0, err := TreeHash(src, testIDs)
			if err != nil {
				t.Fatal(err)
			}
			var before unix.Statfs_t
			_ = unix.Statfs(base, &before)
			dst := filepath.Join(base, "dst")
			if err := d.Clone(context.Background(), src, dst); err != nil {
				t.Fatal(err)
			}
			if h, err := TreeHash(dst, testIDs); err != nil || h != h0 {
				t.Fatalf("clone hashes %s %v, want %s", h, err, h0)
			}
			// What TreeHash does not see: overlay bookkeeping xattrs.
			if v, err := getxattr(filepath.Join(dst, "etc/a"), "user.overlay.origin"); err != nil || string(v) != "x" {
				t.Errorf("user.overlay.origin = %q, %v", v, err)
			}
			if st := lstat(t, filepath.Join(dst, "etc/a")); st.Ino != lstat(t, filepath.Join(dst, "etc/a-link")).Ino {
				t.Error("hardlink not kept")
			}
			if c.reflink {
				// 3 MiB cloned: data blocks are shared, not allocated again.
				var after unix.Statfs_t
				_ = unix.Statfs(base, &after)
				if used := int64(before.Bfree-after.Bfree) * int64(after.Bsize); used > 2<<20 {
					t.Errorf("reflink clone allocated %d bytes", used)
				}
			}
			// Copies are independent both ways.
			if err := os.WriteFile(filepath.Join(dst, "etc/big"), []byte("changed"), 0o600); err != nil {
				t.Fatal(err)
			}
			if h, _ := TreeHash(src, testIDs); h != h0 {
				t.Fatal("writing the clone changed the source")
			}
			if b, _ := os.ReadFile(filepath.Join(src, "etc/a")); !bytes.Equal(b, []byte("alpha")) {
				t.Fatal("source content changed")
			}

			// The store picks the driver on its own and captures with it.
			s, err := New(filepath.Join(base, "layers"), testIDs)
			if err != nil {
				t.Fatal(err)
			}
			if s.Driver().Name() != d.Name() {
				t.Fatalf("store driver %s, probe %s", s.Driver().Name(), d.Name())
			}
			l, err := s.CreateFromCopy(context.Background(), src, CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if l.Digest != h0 {
				t.Fatalf("layer digest %s, want %s", l.Digest, h0)
			}
			assertTmpEmpty(t, s)
		})
	}
}

func TestProbeCopyOnExt4(t *testing.T) {
	testutil.RequiresRoot(t)
	d, err := ProbeDriver(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if fs := d.Features().Filesystem; fs == "ext4" && d.Name() != "copy" {
		t.Fatalf("ext4 has no reflink, got driver %s", d.Name())
	}
}
