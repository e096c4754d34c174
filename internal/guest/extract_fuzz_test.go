package guest

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

// extractSeeds are archives of every shape the extractor must handle:
// ordinary trees, links, every refused type, escapes, sparse forms.
func extractSeeds() [][]byte {
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
		{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "f"},
		{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		{Name: "d/p", Typeflag: tar.TypeFifo, Mode: 0o600},
	} {
		_ = tw.WriteHeader(h)
		if h.Size > 0 {
			_, _ = tw.Write([]byte("hi"))
		}
	}
	_ = tw.Close()
	one := func(es ...rawtar.Entry) []byte {
		var b rawtar.Builder
		for _, e := range es {
			b.Add(e)
		}
		return b.Bytes()
	}
	x := []byte("x")
	return [][]byte{
		good.Bytes(),
		rawtar.PAXSparse1("s", 1<<20, x),
		rawtar.PAXSparse0("s", 1<<20, x),
		rawtar.OldGNUSparse("s", 1<<20, x),
		one(rawtar.Entry{Name: "c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}),
		one(rawtar.Entry{Name: "../escape", Typeflag: '0', Size: 1, Data: x}),
		one(rawtar.Entry{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, rawtar.Entry{Name: "l/escape", Typeflag: '0', Size: 1, Data: x}),
		one(rawtar.Entry{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}),
		one(rawtar.Entry{Name: "f", Typeflag: '0', Size: 1 << 40, Data: x}),
	}
}

// FuzzExtract extracts arbitrary bytes into a directory and checks that
// nothing outside it was created or changed, and that no device was made.
func FuzzExtract(f *testing.F) {
	for _, s := range extractSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, "outside"), []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = extractTar(fd, bytes.NewReader(b), false)
		unix.Close(fd)
		entries, err := os.ReadDir(base)
		if err != nil || len(entries) != 2 {
			t.Fatalf("base dir holds %v, %v; want only root and outside", entries, err)
		}
		if got, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(got) != "keep" {
			t.Fatalf("outside file changed: %q, %v", got, err)
		}
		if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
			t.Fatalf("root replaced: %v", err)
		}
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type()&(os.ModeDevice|os.ModeCharDevice|os.ModeSocket) != 0 {
				t.Errorf("%s is a %v", p, d.Type())
			}
			return nil
		})
	})
}
