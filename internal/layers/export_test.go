package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestExportTarRoundTrip(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	dir, err := s.TempDir("t-")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "l")
	mkLayerDir(t, root, "etc/a=alpha", "etc/a2=>etc/a", "etc/gone!", "var/opq/!", "var/opq/x=1",
		"bin/sh->busybox", "usr/lib/f=data")
	if err := unix.Lsetxattr(filepath.Join(root, "usr/lib/f"), "user.note", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(root, "usr/lib/f"), "user.overlay.origin", []byte("junk"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(root, "etc/a"), 0o4755); err != nil {
		t.Fatal(err)
	}
	l, err := s.CreateFromDir(ctx, root, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.ExportTar(ctx, l.ID, &buf); err != nil {
		t.Fatal(err)
	}
	// The OCI forms of the overlay metadata, ids inside the sandbox.
	names := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = h
	}
	for _, n := range []string{"./", "etc/.wh.gone", "var/opq/", "var/opq/.wh..wh..opq", "etc/a2"} {
		if names[n] == nil {
			t.Errorf("no entry %q in %v", n, names)
		}
	}
	if h := names["etc/a2"]; h != nil && (h.Typeflag != tar.TypeLink || h.Linkname != "etc/a") {
		t.Errorf("hardlink entry %+v", h)
	}
	if h := names["etc/a"]; h == nil || h.Uid != 0 || h.Mode != 0o4755 {
		t.Errorf("etc/a header %+v", h)
	}
	if h := names["usr/lib/f"]; h == nil || h.PAXRecords["SCHILY.xattr.user.note"] != "v" || h.PAXRecords["SCHILY.xattr.user.overlay.origin"] != "" {
		t.Errorf("xattrs of usr/lib/f: %+v", h)
	}
	// Importing it into another store gives the same digest.
	s2 := newStore(t)
	l2, err := s2.ImportTar(ctx, &buf, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Digest != l.Digest || l2.ID != l.ID {
		t.Fatalf("round trip digest %s, want %s", l2.Digest, l.Digest)
	}
}
