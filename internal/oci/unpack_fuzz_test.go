package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

// unpackSeeds are FuzzUnpack's seeds (also in testdata/fuzz).
func unpackSeeds() [][]byte {
	x := []byte("x")
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	for _, h := range []*tar.Header{
		{Name: "blobs/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "blobs/sha256/a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		{Name: "index.json", Typeflag: tar.TypeSymlink, Linkname: "blobs/sha256/a"},
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

// FuzzUnpack unpacks arbitrary bytes as an image archive and checks that
// nothing is written outside the spool directory.
func FuzzUnpack(f *testing.F) {
	for _, s := range unpackSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		spool := filepath.Join(base, "spool")
		if err := os.Mkdir(spool, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, "outside"), []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		_ = unpack(context.Background(), bytes.NewReader(b), spool)
		ents, err := os.ReadDir(base)
		if err != nil || len(ents) != 2 {
			t.Fatalf("beside the spool: %v, %v", ents, err)
		}
		if got, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(got) != "keep" {
			t.Fatalf("outside file: %q, %v", got, err)
		}
	})
}
