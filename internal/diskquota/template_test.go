package diskquota

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// fsUUID is the ext4 filesystem UUID in image's superblock.
func fsUUID(t testing.TB, image string) []byte {
	t.Helper()
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	uuid := make([]byte, 16)
	if _, err := f.ReadAt(uuid, 1024+0x68); err != nil {
		t.Fatal(err)
	}
	return uuid
}

// With a template image, the loop method behaves as without: the
// conformance suite passes with one sandbox's limits copied from the
// template (sba: its image has the template's UUID, and is sparse) and
// another's formatted at Apply (sbb: other limits). What a killed daemon
// left is replaced by the next KeepTemplate; Close deletes the template
// and leaves no image, mount or loop device.
func TestLoopTemplate(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "mkfs.ext4")
	l, err := NewLoop(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := os.MkdirAll(filepath.Join(l.Images, templateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(l.Images, templateDir, "stale.img")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lim := Limits{Bytes: 32 << 20, Inodes: 2048}
	if err := l.KeepTemplate(context.Background(), lim); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a previous template survived KeepTemplate: %v", err)
	}
	tmpl := fsUUID(t, l.tmpl.path)
	dir := filepath.Join(t.TempDir(), "sbx")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(context.Background(), dir, "sbx", lim); err != nil {
		t.Fatal(err)
	}
	img := l.image("sbx")
	if got := fsUUID(t, img); string(got) != string(tmpl) {
		t.Fatalf("Apply of the template's limits formatted its own image")
	}
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil || st.Blocks*512 > 8<<20 {
		t.Fatalf("copied image holds %d bytes (%v), want a sparse copy", st.Blocks*512, err)
	}
	if err := l.Remove(context.Background(), dir, "sbx"); err != nil {
		t.Fatal(err)
	}

	testQuota(t, l, t.TempDir())
	if ids, _ := l.IDs(); len(ids) != 0 {
		t.Fatalf("IDs lists the template: %v", ids)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(l.Images); len(ents) != 0 {
		t.Fatalf("left in the images dir after Close: %v", ents)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// An image never has more inodes than its limit (mkfs rounds -N up to
// whole inode-table blocks per group), and not many fewer.
func TestImageInodes(t *testing.T) {
	testutil.RequiresBinary(t, "mkfs.ext4")
	testutil.RequiresBinary(t, "dumpe2fs")
	for _, lim := range []Limits{
		{Bytes: 10 << 30, Inodes: 512 << 10},
		{Bytes: 64 << 20, Inodes: 4096},
		{Bytes: MinBytes, Inodes: 1024},
		{Bytes: 100 << 30, Inodes: 512 << 10},
		{Bytes: 3<<30 + 12345, Inodes: 100003},
	} {
		img := filepath.Join(t.TempDir(), "x.img")
		if err := createImage(context.Background(), img, lim); err != nil {
			t.Fatalf("%+v: %v", lim, err)
		}
		out, err := exec.Command("dumpe2fs", "-h", img).Output()
		if err != nil {
			t.Fatalf("dumpe2fs: %v", err)
		}
		var n int64
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "Inode count:"); ok {
				n, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		if n > lim.Inodes || n < lim.Inodes*9/10 {
			t.Errorf("%+v: %d inodes", lim, n)
		}
	}
}

// BenchmarkLoopApply measures Apply and Remove of the default limit,
// formatted at Apply and copied from the template.
func BenchmarkLoopApply(b *testing.B) {
	testutil.RequiresRoot(b)
	testutil.RequiresBinary(b, "mkfs.ext4")
	lim := Limits{Bytes: 10 << 30, Inodes: 512 << 10}
	for _, tmpl := range []bool{false, true} {
		b.Run(map[bool]string{false: "mkfs", true: "template"}[tmpl], func(b *testing.B) {
			l, err := NewLoop(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if tmpl {
				if err := l.KeepTemplate(context.Background(), lim); err != nil {
					b.Fatal(err)
				}
			}
			base := b.TempDir()
			var apply, remove time.Duration
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(base, strconv.Itoa(i))
				if err := os.Mkdir(dir, 0o711); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := l.Apply(context.Background(), dir, strconv.Itoa(i), lim); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := l.Remove(context.Background(), dir, strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
				apply += t1.Sub(t0)
				remove += time.Since(t1)
			}
			b.ReportMetric(float64(apply.Microseconds())/float64(b.N), "apply-µs/op")
			b.ReportMetric(float64(remove.Microseconds())/float64(b.N), "remove-µs/op")
		})
	}
}
