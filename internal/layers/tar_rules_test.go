package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

// Sparse entries and unknown types fail the import with an invalid
// argument (old-GNU 'S' used to be expanded, holes written as data); an
// entry declaring more than the filesystem holds fails before writing
// with resource exhausted (the rules of rawtar.Rules, the table the image
// import and the guest upload tests share). Nothing is left behind.
func TestImportTarRules(t *testing.T) {
	s := newStore(t)
	x := []byte("x")
	for _, tc := range rawtar.Rules() {
		if tc.Layer == nil {
			continue // accepted: see the end of the test
		}
		t.Run(tc.Name, func(t *testing.T) {
			_, err := s.ImportTar(context.Background(), bytes.NewReader(tc.Tar), CreateOptions{})
			if !errors.Is(err, tc.Layer) {
				t.Fatalf("err = %v, want %v", err, tc.Layer)
			}
		})
	}
	if n := len(s.List()); n != 0 {
		t.Errorf("%d layers after rejected imports", n)
	}
	assertTmpEmpty(t, s)
	// Skipped, not refused: a global header, a block device, a FIFO.
	var b rawtar.Builder
	b.Add(rawtar.Entry{Name: "g", Typeflag: tar.TypeXGlobalHeader})
	b.Add(rawtar.Entry{Name: "blk", Typeflag: tar.TypeBlock, Devmajor: 7})
	b.Add(rawtar.Entry{Name: "p", Typeflag: tar.TypeFifo, Mode: 0o644})
	b.Add(rawtar.Entry{Name: "c", Typeflag: tar.TypeCont, Mode: 0o644, Size: 1, Data: x})
	l, err := s.ImportTar(context.Background(), bytes.NewReader(b.Bytes()), CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(l.Path)
	if len(ents) != 1 || ents[0].Name() != "c" {
		t.Fatalf("layer holds %v, want only c", ents)
	}
	if got, err := os.ReadFile(filepath.Join(l.Path, "c")); err != nil || string(got) != "x" {
		t.Fatalf("contiguous file: %q, %v", got, err)
	}
}

// FuzzImportTar imports arbitrary bytes as a layer and checks that nothing
// is written beside the store, and that a failed import leaves no layer
// and no temporary directory.
// importSeeds are FuzzImportTar's seeds (also in testdata/fuzz).
func importSeeds() [][]byte {
	x := []byte("x")
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "../../x"},
		{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		{Name: "d/.wh.gone", Typeflag: tar.TypeReg},
	} {
		_ = tw.WriteHeader(h)
		if h.Size > 0 {
			_, _ = tw.Write(x)
		}
	}
	_ = tw.Close()
	var esc rawtar.Builder
	esc.Add(rawtar.Entry{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}).Add(rawtar.Entry{Name: "l/evil", Typeflag: '0', Size: 1, Data: x})
	return [][]byte{good.Bytes(), esc.Bytes(), rawtar.PAXSparse1("s", 1<<20, x), rawtar.OldGNUSparse("s", 1<<20, x)}
}

func FuzzImportTar(f *testing.F) {
	for _, seed := range importSeeds() {
		f.Add(seed)
	}
	base := f.TempDir()
	s := newStoreAt(f, filepath.Join(base, "layers"))
	if err := os.WriteFile(filepath.Join(base, "outside"), []byte("keep"), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		before := len(s.List())
		l, err := s.ImportTar(context.Background(), bytes.NewReader(b), CreateOptions{})
		if err == nil {
			_ = s.Remove(context.Background(), l.ID)
		} else if n := len(s.List()); n != before {
			t.Fatalf("failed import left a layer (%d -> %d): %v", before, n, err)
		}
		ents, err := os.ReadDir(base)
		if err != nil || len(ents) != 2 {
			t.Fatalf("beside the store: %v, %v", ents, err)
		}
		if got, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(got) != "keep" {
			t.Fatalf("outside file: %q, %v", got, err)
		}
	})
}
