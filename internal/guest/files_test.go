package guest_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

func TestFileStreamLarge(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	const size = 50 << 20
	p := filepath.Join(t.TempDir(), "sub", "big.bin")
	src := io.LimitReader(rand.NewChaCha8([32]byte{1}), size)
	h := sha256.New()
	fi, err := c.WriteFile(ctx, p, 0o640, true, io.TeeReader(src, h))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != size || fi.Mode != 0o640 || fi.Type != api.FileTypeFile || fi.Name != "big.bin" {
		t.Fatalf("FileInfo %+v", fi)
	}
	rc, info, err := c.ReadFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h2 := sha256.New()
	n, err := io.Copy(h2, rc)
	if err != nil || n != size || info.Size != size {
		t.Fatalf("read %d bytes, %v (info %+v)", n, err, info)
	}
	if !bytes.Equal(h.Sum(nil), h2.Sum(nil)) {
		t.Fatal("content differs")
	}
	// No temp files left behind.
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries", len(entries))
	}
}

func TestFileOps(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	dir := t.TempDir()
	if _, err := c.WriteFile(ctx, dir+"/missing/f", 0, false, strings.NewReader("x")); !errdefs.IsNotFound(err) {
		t.Fatalf("write without parents: %v", err)
	}
	if _, err := c.WriteFile(ctx, dir, 0, false, strings.NewReader("x")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("write onto a directory: %v", err)
	}
	fi, err := c.Mkdir(ctx, api.MkdirRequest{Path: dir + "/a/b/c", Parents: true, Mode: 0o700})
	if err != nil || fi.Type != api.FileTypeDir || fi.Mode != 0o700 {
		t.Fatalf("mkdir: %+v %v", fi, err)
	}
	if _, err := c.Mkdir(ctx, api.MkdirRequest{Path: dir + "/a"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("mkdir existing: %v", err)
	}
	if _, err := c.Mkdir(ctx, api.MkdirRequest{Path: dir + "/x/y"}); !errdefs.IsNotFound(err) {
		t.Fatalf("mkdir without parents: %v", err)
	}
	if _, err := c.WriteFile(ctx, dir+"/a/f.txt", 0, false, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", dir+"/a/link"); err != nil {
		t.Fatal(err)
	}
	entries, err := c.List(ctx, dir+"/a")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.FileInfo{}
	for _, e := range entries {
		got[e.Name] = e
	}
	if len(got) != 3 || got["b"].Type != api.FileTypeDir || got["f.txt"].Size != 5 || got["f.txt"].Mode != 0o644 ||
		got["link"].Type != api.FileTypeSymlink || got["link"].LinkTarget != "/etc/passwd" || got["f.txt"].Path != dir+"/a/f.txt" {
		t.Fatalf("list: %+v", entries)
	}
	if _, err := c.List(ctx, dir+"/a/f.txt"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("list of a file: %v", err)
	}
	if fi, err := c.Stat(ctx, dir+"/a/link"); err != nil || fi.Type != api.FileTypeSymlink {
		t.Fatalf("stat symlink: %+v %v", fi, err)
	}
	if _, err := c.Stat(ctx, dir+"/nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("stat missing: %v", err)
	}
	if _, _, err := c.ReadFile(ctx, dir+"/a"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("read of a directory: %v", err)
	}
	if err := c.Move(ctx, api.MoveRequest{From: dir + "/a/f.txt", To: dir + "/g.txt"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dir + "/g.txt"); err != nil || string(b) != "hello" {
		t.Fatalf("after move: %q %v", b, err)
	}
	if err := c.Remove(ctx, dir+"/a", false); !errdefs.IsConflict(err) {
		t.Fatalf("remove non-empty dir: %v", err)
	}
	if err := c.Remove(ctx, dir+"/a", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, dir+"/a", true); !errdefs.IsNotFound(err) {
		t.Fatalf("remove missing: %v", err)
	}
	if err := c.Remove(ctx, "/", true); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("remove /: %v", err)
	}
}

func TestPathValidation(t *testing.T) {
	c, sock := startGuest(t, guest.Options{})
	ctx := tctx(t)
	bad := []string{"", "relative/path", "/a\x00b", "/" + strings.Repeat("a", 5000)}
	for _, p := range bad {
		if _, err := c.Stat(ctx, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("client Stat(%q): %v", p, err)
		}
		// The guest checks too, for clients that do not.
		for _, op := range []string{proto.OpStat, proto.OpReadFile, proto.OpList, proto.OpRemove, proto.OpReadArchive} {
			if err := rawCall(t, sock, &proto.Request{V: proto.Version, Op: op, Path: p}); !errdefs.IsInvalidArgument(err) {
				t.Errorf("guest %s(%.20q): %v", op, p, err)
			}
		}
	}
	if err := rawCall(t, sock, &proto.Request{V: 99, Op: proto.OpVersion}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("wrong protocol version: %v", err)
	}
	if err := rawCall(t, sock, &proto.Request{V: proto.Version, Op: "bogus"}); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("unknown op: %v", err)
	}
}

// rawCall sends req on a fresh connection and returns the error of the
// first frame (nil for any other frame).
func rawCall(t *testing.T, sock string, req *proto.Request) error {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := proto.WriteRequest(conn, req); err != nil {
		t.Fatal(err)
	}
	typ, b, err := proto.ReadFrame(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	if typ != proto.FrameError {
		return nil
	}
	var e proto.Error
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return e.Err()
}

func TestArchiveRoundTrip(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	src := t.TempDir()
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.MkdirAll(src+"/d/e", 0o750))
	must(t, os.WriteFile(src+"/d/f.txt", []byte("content"), 0o600))
	must(t, os.WriteFile(src+"/x.sh", []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Symlink("/etc/passwd", src+"/d/link"))
	must(t, os.Chtimes(src+"/d/f.txt", mtime, mtime))
	rc, err := c.ReadArchive(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		names[h.Name] = true
	}
	for _, n := range []string{"d/", "d/e/", "d/f.txt", "d/link", "x.sh"} {
		if !names[n] {
			t.Errorf("archive lacks %q (has %v)", n, names)
		}
	}
	dst := filepath.Join(t.TempDir(), "new")
	if err := c.WriteArchive(ctx, dst, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst + "/d/f.txt"); err != nil || string(b) != "content" {
		t.Fatalf("extracted file: %q %v", b, err)
	}
	for p, mode := range map[string]os.FileMode{"/d/f.txt": 0o600, "/x.sh": 0o755, "/d": 0o750} {
		fi, err := os.Lstat(dst + p)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %v", p, fi.Mode(), err, mode)
		}
	}
	if fi, _ := os.Stat(dst + "/d/f.txt"); !fi.ModTime().Equal(mtime) {
		t.Errorf("mtime %v, want %v", fi.ModTime(), mtime)
	}
	if target, err := os.Readlink(dst + "/d/link"); err != nil || target != "/etc/passwd" {
		t.Errorf("symlink: %q %v", target, err)
	}
	if _, err := c.ReadArchive(ctx, src+"/nope"); !errdefs.IsNotFound(err) {
		t.Errorf("archive of a missing dir: %v", err)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func makeTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		must(t, tw.WriteHeader(h))
		if e.typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func TestArchiveUploadRejectsEscapes(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	base := t.TempDir()
	outside := base + "/outside"
	must(t, os.Mkdir(outside, 0o755))
	target := base + "/target"
	for _, tc := range []struct {
		name    string
		entries []entry
		escaped string
	}{
		{"dotdot", []entry{{name: "../outside/evil", typ: tar.TypeReg, body: "x"}}, outside + "/evil"},
		{"nested dotdot", []entry{{name: "a/../../outside/evil2", typ: tar.TypeReg, body: "x"}}, outside + "/evil2"},
		{"absolute", []entry{{name: outside + "/evil3", typ: tar.TypeReg, body: "x"}}, outside + "/evil3"},
		{"through symlink", []entry{
			{name: "link", typ: tar.TypeSymlink, link: outside},
			{name: "link/evil4", typ: tar.TypeReg, body: "x"},
		}, outside + "/evil4"},
		{"through relative symlink", []entry{
			{name: "rel", typ: tar.TypeSymlink, link: "../outside"},
			{name: "rel/sub/evil5", typ: tar.TypeReg, body: "x"},
		}, outside + "/sub"},
		{"hardlink out", []entry{{name: "hl", typ: tar.TypeLink, link: "../outside/f"}}, ""},
	} {
		err := c.WriteArchive(ctx, target, bytes.NewReader(makeTar(t, tc.entries...)))
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err %v, want invalid argument", tc.name, err)
		}
		if tc.escaped != "" {
			if _, err := os.Lstat(tc.escaped); err == nil {
				t.Errorf("%s: %s was created", tc.name, tc.escaped)
			}
		}
	}
	// A regular file entry over a planted symlink replaces the link; it
	// never writes through it.
	err := c.WriteArchive(ctx, target, bytes.NewReader(makeTar(t,
		entry{name: "plant", typ: tar.TypeSymlink, link: outside + "/victim"},
		entry{name: "plant", typ: tar.TypeReg, body: "safe"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(outside + "/victim"); err == nil {
		t.Error("wrote through a planted symlink")
	}
	if b, err := os.ReadFile(target + "/plant"); err != nil || string(b) != "safe" {
		t.Errorf("plant: %q %v", b, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("outside dir has %d entries", len(entries))
	}
	// Garbage is an invalid argument, not a crash.
	if err := c.WriteArchive(ctx, target, strings.NewReader(strings.Repeat("garbage!", 200))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("garbage tar: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
