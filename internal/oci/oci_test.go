package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

var testIDs = runtime.IDMap{HostID: 100000, Size: 65536}

func newStore(t *testing.T) *layers.Store {
	t.Helper()
	testutil.RequiresRoot(t)
	s, err := layers.New(filepath.Join(t.TempDir(), "layers"), testIDs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type entry struct {
	name, body string
	typ        byte
	uid        int
	xattrs     map[string]string
}

// layerTar returns a layer tar (gzip'd when gz) in OCI form.
func layerTar(t *testing.T, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Uid: e.uid, Gid: e.uid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			h.Mode = 0o755
		case tar.TypeSymlink:
			h.Linkname = e.body
		case tar.TypeReg:
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	baseLayer = []entry{
		{name: "bin/", typ: tar.TypeDir}, {name: "bin/sh", body: "#!busybox", typ: tar.TypeReg},
		{name: "bin/python3", body: "py", typ: tar.TypeReg},
		{name: "etc/", typ: tar.TypeDir}, {name: "etc/app/", typ: tar.TypeDir},
		{name: "etc/app/old.conf", body: "old", typ: tar.TypeReg},
		{name: "home/", typ: tar.TypeDir}, {name: "home/u/", typ: tar.TypeDir, uid: 1000},
		{name: "home/u/f", body: "mine", typ: tar.TypeReg, uid: 1000, xattrs: map[string]string{"user.tag": "t"}},
		{name: "lib", body: "usr/lib", typ: tar.TypeSymlink},
	}
	topLayer = []entry{
		{name: "bin/", typ: tar.TypeDir}, {name: "bin/.wh.python3", typ: tar.TypeReg},
		{name: "etc/", typ: tar.TypeDir}, {name: "etc/app/", typ: tar.TypeDir},
		{name: "etc/app/.wh..wh..opq", typ: tar.TypeReg},
		{name: "etc/app/new.conf", body: "new", typ: tar.TypeReg},
	}
)

// writeLayout writes an OCI image layout, as a third-party tool would, with
// the image-spec types; it returns the layout dir.
func writeLayout(t *testing.T, layerBlobs ...[]byte) string {
	t.Helper()
	dir := t.TempDir()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) digest.Digest {
		d := digest.FromBytes(b)
		if err := os.WriteFile(filepath.Join(blobs, d.Encoded()), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	var descs []v1.Descriptor
	var diffIDs []digest.Digest
	for _, b := range layerBlobs {
		descs = append(descs, v1.Descriptor{MediaType: v1.MediaTypeImageLayerGzip, Digest: put(b), Size: int64(len(b))})
		diffIDs = append(diffIDs, digest.FromBytes(gunzip(t, b)))
	}
	cfg, _ := json.Marshal(v1.Image{
		Platform: v1.Platform{OS: "linux", Architecture: "amd64"},
		Config:   v1.ImageConfig{Env: []string{"PATH=/bin", "LANG=C.UTF-8"}},
		RootFS:   v1.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	man, _ := json.Marshal(v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: v1.MediaTypeImageManifest,
		Config: v1.Descriptor{MediaType: v1.MediaTypeImageConfig, Digest: put(cfg), Size: int64(len(cfg))},
		Layers: descs,
	})
	idx, _ := json.Marshal(v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{{MediaType: v1.MediaTypeImageManifest, Digest: put(man), Size: int64(len(man))}},
	})
	lay, _ := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	for name, b := range map[string][]byte{v1.ImageIndexFile: idx, v1.ImageLayoutFile: lay} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestImportLayoutTranslatesWhiteouts(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	dir := writeLayout(t, layerTar(t, true, baseLayer...), layerTar(t, true, topLayer...))
	res, err := ImportLayout(ctx, s, dir)
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 2 || res.Env["LANG"] != "C.UTF-8" || res.Env["PATH"] != "/bin" {
		t.Fatalf("result %+v", res)
	}
	paths, err := s.Paths(res.Top)
	if err != nil || len(paths) != 2 {
		t.Fatalf("chain %v, %v", paths, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(paths[0], "bin/python3"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf(".wh.python3 did not become an overlay whiteout: %v %o", err, st.Mode)
	}
	if v, err := unix.Lgetxattr(filepath.Join(paths[0], "etc/app"), "user.overlay.opaque", make([]byte, 8)); err != nil || v != 1 {
		t.Errorf("etc/app not opaque: %v", err)
	}
	if err := unix.Lstat(filepath.Join(paths[1], "home/u/f"), &st); err != nil || st.Uid != 101000 {
		t.Errorf("home/u/f owner %d, %v", st.Uid, err)
	}
	// Exported again, the whiteouts are back in OCI form, ids inside.
	rc, err := Export(ctx, s, res.Top, Image{Name: "x", Env: res.Env, Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := t.TempDir()
	if err := unpack(ctx, rc, out); err != nil {
		t.Fatal(err)
	}
	var idx v1.Index
	l := layout{root: out}
	if err := l.readJSON(v1.ImageIndexFile, "", &idx); err != nil {
		t.Fatal(err)
	}
	m, err := l.pickManifest(v1.ImageIndexFile, "", 0)
	if err != nil || len(m.Layers) != 2 {
		t.Fatalf("manifest %+v, %v", m, err)
	}
	f, err := openBeneath(out, blobPath(m.Layers[1].Digest))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*tar.Header{}
	tr := tar.NewReader(zr)
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
	for _, n := range []string{"bin/.wh.python3", "etc/app/.wh..wh..opq", "etc/app/new.conf"} {
		if names[n] == nil {
			t.Errorf("exported top layer lacks %s", n)
		}
	}
	if h := names["etc/app/new.conf"]; h != nil && h.Uid != 0 {
		t.Errorf("exported owner %d, want 0 (inside id)", h.Uid)
	}
}

func TestExportImportRoundTrip(t *testing.T) {
	src := newStore(t)
	ctx := context.Background()
	res, err := ImportLayout(ctx, src, writeLayout(t, layerTar(t, true, baseLayer...), layerTar(t, true, topLayer...)))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := Export(ctx, src, res.Top, Image{Name: "rt", Env: res.Env, Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if _, err := io.Copy(&archive, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	dst := newStore(t)
	got, err := ImportArchive(ctx, dst, bytes.NewReader(archive.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got.Top != res.Top {
		t.Fatalf("round trip top %s, want %s (same chain of tree hashes)", got.Top, res.Top)
	}
	a, _ := src.Chain(res.Top)
	b, _ := dst.Chain(got.Top)
	for i := range a {
		if a[i].Digest != b[i].Digest {
			t.Errorf("layer %d: digest %s, want %s", i, b[i].Digest, a[i].Digest)
		}
	}
	if got.Env["LANG"] != "C.UTF-8" {
		t.Errorf("env %v", got.Env)
	}
	// The spool is gone once the reader is closed.
	if ents, _ := os.ReadDir(filepath.Join(src.Root(), "tmp")); len(ents) != 0 {
		t.Errorf("export left %d scratch entries", len(ents))
	}
}

func TestImportDockerSave(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	base, top := layerTar(t, false, baseLayer...), layerTar(t, false, topLayer...)
	cfg, _ := json.Marshal(v1.Image{Config: v1.ImageConfig{Env: []string{"A=1"}},
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(base), digest.FromBytes(top)}}})
	man, _ := json.Marshal([]dockerManifest{{Config: "cfg.json", RepoTags: []string{"x:latest"}, Layers: []string{"aaa/layer.tar", "bbb/layer.tar"}}})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
	}
	add("manifest.json", man)
	add("cfg.json", cfg)
	tw.WriteHeader(&tar.Header{Name: "aaa/", Typeflag: tar.TypeDir, Mode: 0o755})
	add("aaa/layer.tar", base)
	tw.WriteHeader(&tar.Header{Name: "bbb/", Typeflag: tar.TypeDir, Mode: 0o755})
	add("bbb/layer.tar", top)
	tw.Close()
	res, err := ImportArchive(ctx, s, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 2 || res.Env["A"] != "1" {
		t.Fatalf("result %+v", res)
	}
	// Same content as the OCI form of the same layers.
	s2 := newStore(t)
	res2, err := ImportLayout(ctx, s2, writeLayout(t, layerTar(t, true, baseLayer...), layerTar(t, true, topLayer...)))
	if err != nil || res2.Top != res.Top {
		t.Fatalf("docker save form %s, OCI form %s, %v", res.Top, res2.Top, err)
	}
}

func TestImportRejects(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	// A blob that does not match its digest.
	dir := writeLayout(t, layerTar(t, true, baseLayer...))
	var idx v1.Index
	l := layout{root: dir}
	if err := l.readJSON(v1.ImageIndexFile, "", &idx); err != nil {
		t.Fatal(err)
	}
	m, _ := l.pickManifest(v1.ImageIndexFile, "", 0)
	bad := layerTar(t, true, entry{name: "evil", body: "x", typ: tar.TypeReg})
	if err := os.WriteFile(filepath.Join(dir, blobPath(m.Layers[0].Digest)), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ImportLayout(ctx, s, dir); !errdefs.IsInvalidArgument(err) {
		t.Errorf("tampered layer: err = %v", err)
	}
	// Archive entries leaving the archive, and symlinks out of the layout.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	if _, err := ImportArchive(ctx, s, &buf); !errdefs.IsInvalidArgument(err) {
		t.Errorf("../x: err = %v", err)
	}
	buf.Reset()
	tw = tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "manifest.json", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	tw.Close()
	if _, err := ImportArchive(ctx, s, &buf); err == nil {
		t.Error("symlink out of the archive was followed")
	}
	if _, err := ImportLayout(ctx, s, t.TempDir()); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty dir: err = %v", err)
	}
	// Sparse, device, link and unknown entries are refused (a sparse
	// entry used to be spooled at its full logical size); an entry
	// declaring more than the disk holds is refused before writing
	// (rawtar.Rules: the table the layer import and guest upload tests
	// share).
	for _, tc := range rawtar.Rules() {
		if tc.Image == nil {
			continue
		}
		if _, err := ImportArchive(ctx, s, bytes.NewReader(tc.Tar)); !errors.Is(err, tc.Image) {
			t.Errorf("%s: err = %v, want %v", tc.Name, err, tc.Image)
		}
	}
}
