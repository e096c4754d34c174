package rawtar

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

// The builders produce what archive/tar reads as sparse files: a logical
// size far above the bytes stored, data first, zeros after.
func TestSparseFormsParse(t *testing.T) {
	data := bytes.Repeat([]byte("A"), 100)
	for name, b := range map[string][]byte{
		"pax1.0": PAXSparse1("f", 1<<20, data),
		"pax0.1": PAXSparse0("f", 1<<20, data),
		"oldgnu": OldGNUSparse("f", 1<<20, data),
	} {
		t.Run(name, func(t *testing.T) {
			tr := tar.NewReader(bytes.NewReader(b))
			hdr, err := tr.Next()
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Name != "f" || hdr.Size != 1<<20 {
				t.Fatalf("header %q size %d", hdr.Name, hdr.Size)
			}
			got, err := io.ReadAll(tr)
			if err != nil || len(got) != 1<<20 || !bytes.Equal(got[:100], data) || got[100] != 0 {
				t.Fatalf("content: %d bytes, %v", len(got), err)
			}
			if _, err := tr.Next(); err != io.EOF {
				t.Fatalf("after the entry: %v", err)
			}
		})
	}
}

func TestDeviceEntry(t *testing.T) {
	var b Builder
	b.Add(Entry{Name: "null", Mode: 0o666, Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3})
	hdr, err := tar.NewReader(bytes.NewReader(b.Bytes())).Next()
	if err != nil || hdr.Typeflag != tar.TypeChar || hdr.Devmajor != 1 || hdr.Devminor != 3 {
		t.Fatalf("%+v, %v", hdr, err)
	}
}
