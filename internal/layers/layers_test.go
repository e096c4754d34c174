package layers

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/testutil"
)

var testIDs = idrange.IDMap{HostID: 100000, Size: 65536}

func newStore(t *testing.T) *Store {
	t.Helper()
	return newStoreAt(t, filepath.Join(t.TempDir(), "layers"))
}

func newStoreAt(t testing.TB, dir string) *Store {
	t.Helper()
	testutil.RequiresRoot(t)
	s, err := New(dir, testIDs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var mtime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// tarOf builds a tar stream; a header with Size -1 gets body as content.
func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.h
		if h.ModTime.IsZero() {
			h.ModTime = mtime
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

type tarEntry struct {
	h    tar.Header
	body string
}

func dir(name string, mode int64) tarEntry {
	return tarEntry{h: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}
func file(name string, mode int64, body string) tarEntry {
	return tarEntry{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}
func symlink(name, target string) tarEntry {
	return tarEntry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func hardlink(name, target string) tarEntry {
	return tarEntry{h: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestImportTar(t *testing.T) {
	s := newStore(t)
	user := file("./home/u/notes", 0o600, "mine")
	user.h.Uid, user.h.Gid = 1000, 1001
	capfile := file("./usr/bin/ping", 0o755, "ping")
	capfile.h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "x", "SCHILY.xattr.user.note": "kept"}
	r := tarOf(t,
		dir("./", 0o755),
		dir("./etc/", 0o755),
		file("./etc/passwd", 0o644, "root:x:0:0::/root:/bin/sh\n"),
		hardlink("./etc/passwd-", "./etc/passwd"),
		file("./usr/bin/su", 0o4755, "su"), // parent dirs implicit
		capfile,
		symlink("./bin", "usr/bin"),
		user,
		dir("./tmp/", 0o1777),
		tarEntry{h: tar.Header{Typeflag: tar.TypeChar, Name: "./dev/null", Devmajor: 1, Devminor: 3, Mode: 0o666}},
		tarEntry{h: tar.Header{Typeflag: tar.TypeFifo, Name: "./fifo", Mode: 0o666}},
		tarEntry{h: tar.Header{Typeflag: tar.TypeChar, Name: "./gone"}},
		file("./var/.wh.old", 0, ""),
		file("./opq/.wh..wh..opq", 0, ""),
	)
	l, err := s.ImportTar(context.Background(), r, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.ID != l.Digest || l.Parent != "" || filepath.Dir(l.Path) != s.Root() || len(filepath.Base(l.Path)) != shortLen {
		t.Fatalf("unexpected layer %+v", l)
	}
	p := func(rel string) string { return filepath.Join(l.Path, rel) }

	st := lstat(t, p("etc/passwd"))
	if st.Uid != 100000 || st.Gid != 100000 || st.Mode&0o7777 != 0o644 || st.Nlink != 2 {
		t.Errorf("etc/passwd: uid %d gid %d mode %o nlink %d", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	if st.Mtim.Sec != mtime.Unix() {
		t.Errorf("etc/passwd mtime %d, want %d", st.Mtim.Sec, mtime.Unix())
	}
	if st2 := lstat(t, p("etc/passwd-")); st2.Ino != st.Ino {
		t.Errorf("hardlink not preserved")
	}
	if st := lstat(t, p("usr/bin/su")); st.Mode&0o7777 != 0o4755 || st.Uid != 100000 {
		t.Errorf("su mode %o uid %d", st.Mode&0o7777, st.Uid)
	}
	if st := lstat(t, p("usr")); st.Mode&0o7777 != 0o755 || st.Uid != 100000 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("implicit dir usr: mode %o uid %d", st.Mode, st.Uid)
	}
	if st := lstat(t, p("home/u/notes")); st.Uid != 101000 || st.Gid != 101001 {
		t.Errorf("notes owned by %d:%d", st.Uid, st.Gid)
	}
	if st := lstat(t, p("tmp")); st.Mode&0o7777 != 0o1777 || st.Mtim.Sec != mtime.Unix() {
		t.Errorf("tmp mode %o mtime %d", st.Mode&0o7777, st.Mtim.Sec)
	}
	if target, err := os.Readlink(p("bin")); err != nil || target != "usr/bin" {
		t.Errorf("bin symlink: %q %v", target, err)
	}
	if st := lstat(t, p("bin")); st.Uid != 100000 {
		t.Errorf("symlink owned by %d", st.Uid)
	}
	if _, err := getxattr(p("usr/bin/ping"), "security.capability"); err == nil {
		t.Errorf("security.capability was kept")
	}
	if v, err := getxattr(p("usr/bin/ping"), "user.note"); err != nil || string(v) != "kept" {
		t.Errorf("user.note: %q %v", v, err)
	}
	for _, rel := range []string{"dev/null", "fifo"} {
		if _, err := os.Lstat(p(rel)); !os.IsNotExist(err) {
			t.Errorf("%s should have been skipped: %v", rel, err)
		}
	}
	for _, rel := range []string{"gone", "var/old"} {
		if st := lstat(t, p(rel)); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s is not a whiteout: mode %o rdev %d", rel, st.Mode, st.Rdev)
		}
	}
	if !opaque(p("opq")) {
		t.Errorf("opq is not opaque")
	}
	if _, err := os.Lstat(p("var/.wh.old")); !os.IsNotExist(err) {
		t.Errorf(".wh. file kept: %v", err)
	}
	if h, err := s.TreeHash(l.Path); err != nil || h != l.Digest {
		t.Errorf("TreeHash %s %v, want %s", h, err, l.Digest)
	}
	// Importing the same content again yields the same layer.
	l2, err := s.ImportTar(context.Background(), tarOf(t, dir("./", 0o755)), CreateOptions{Parent: l.ID})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Parent != l.ID || l2.ID == l.ID {
		t.Errorf("child layer %+v", l2)
	}
	paths, err := s.Paths(l2.ID)
	if err != nil || len(paths) != 2 || paths[0] != l2.Path || paths[1] != l.Path {
		t.Errorf("Paths = %v %v", paths, err)
	}
	assertTmpEmpty(t, s)
}

func assertTmpEmpty(t *testing.T, s *Store) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Root(), tmpName))
	if err != nil || len(ents) != 0 {
		t.Errorf("tmp not empty: %v %v", ents, err)
	}
}

func TestImportTarRejects(t *testing.T) {
	s := newStore(t)
	outside := t.TempDir()
	bigUID := file("big", 0o644, "x")
	bigUID.h.Uid = 65536
	cases := map[string][]tarEntry{
		"dotdot":               {file("../x", 0o644, "x")},
		"nested dotdot":        {dir("a/", 0o755), file("a/../../x", 0o644, "x")},
		"absolute":             {file("/abs", 0o644, "x")},
		"through symlink":      {symlink("a", outside), file("a/f", 0o644, "x")},
		"through rel symlink":  {dir("d/", 0o755), symlink("a", "d"), file("a/f", 0o644, "x")},
		"dir through symlink":  {symlink("a", outside), dir("a/sub/", 0o755)},
		"uid outside map":      {bigUID},
		"hardlink escape":      {hardlink("h", "../../../../etc/passwd")},
		"hardlink absolute":    {hardlink("h", "/etc/passwd")},
		"hardlink via symlink": {symlink("a", "/etc"), hardlink("h", "a/passwd")},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := s.ImportTar(context.Background(), tarOf(t, entries...), CreateOptions{})
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("wrote outside the layer: %v", ents)
			}
		})
	}
	if n := len(s.List()); n != 0 {
		t.Errorf("%d layers after rejected imports", n)
	}
	assertTmpEmpty(t, s)
}

// mkTree makes a small tree owned by mapped root.
func mkTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc/sub"), 0o755))
	must(os.Chmod(root, 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/a"), []byte("alpha"), 0o644))
	must(os.Link(filepath.Join(root, "etc/a"), filepath.Join(root, "etc/a-link")))
	must(os.Symlink("a", filepath.Join(root, "etc/ln")))
	must(unix.Mknod(filepath.Join(root, "wh"), unix.S_IFCHR, 0))
	must(filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 100000, 100000)
	}))
}

func TestTreeHash(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	mkTree(t, root)
	h0, err := TreeHash(root, testIDs)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := TreeHash(root, testIDs); h != h0 {
		t.Fatal("TreeHash not stable")
	}
	// A copy made at another time, with other mtimes, hashes the same.
	cp := filepath.Join(t.TempDir(), "cp")
	if err := copyTree(context.Background(), root, cp, copyOptions{preserve: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(cp, "etc/a"), time.Unix(1, 0), time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	if h, err := TreeHash(cp, testIDs); err != nil || h != h0 {
		t.Fatalf("copy hashes %s %v, want %s", h, err, h0)
	}
	changes := map[string]func(dir string) error{
		"content": func(d string) error { return os.WriteFile(filepath.Join(d, "etc/a"), []byte("alphA"), 0o644) },
		"mode":    func(d string) error { return os.Chmod(filepath.Join(d, "etc/a"), 0o640) },
		"setuid":  func(d string) error { return unix.Chmod(filepath.Join(d, "etc/a"), 0o4644) },
		"owner":   func(d string) error { return os.Lchown(filepath.Join(d, "etc/a"), 100001, 100000) },
		"group":   func(d string) error { return os.Lchown(filepath.Join(d, "etc/sub"), 100000, 100005) },
		"link": func(d string) error {
			os.Remove(filepath.Join(d, "etc/ln"))
			return os.Symlink("b", filepath.Join(d, "etc/ln"))
		},
		"opaque": func(d string) error { return unix.Lsetxattr(filepath.Join(d, "etc/sub"), xattrOpaque, []byte("y"), 0) },
		"new file": func(d string) error {
			return os.WriteFile(filepath.Join(d, "etc/sub/new"), nil, 0o644)
		},
		"unlink hardlink": func(d string) error {
			os.Remove(filepath.Join(d, "etc/a-link"))
			return os.WriteFile(filepath.Join(d, "etc/a-link"), []byte("alpha"), 0o644)
		},
		"whiteout removed": func(d string) error { return os.Remove(filepath.Join(d, "wh")) },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "d")
			if err := copyTree(context.Background(), root, d, copyOptions{preserve: true}); err != nil {
				t.Fatal(err)
			}
			if err := change(d); err != nil {
				t.Fatal(err)
			}
			// Files created by the change belong to host root: remap.
			filepath.Walk(d, func(p string, fi os.FileInfo, _ error) error {
				var st unix.Stat_t
				unix.Lstat(p, &st)
				if st.Uid == 0 {
					os.Lchown(p, 100000, 100000)
				}
				return nil
			})
			h, err := TreeHash(d, testIDs)
			if err != nil {
				t.Fatal(err)
			}
			if h == h0 {
				t.Errorf("change %q not reflected in TreeHash", name)
			}
		})
	}
	// Host ids outside the map are refused.
	if err := os.Lchown(filepath.Join(cp, "etc/a"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := TreeHash(cp, testIDs); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unmapped owner: err = %v", err)
	}
}

func TestNewCleansLeftovers(t *testing.T) {
	testutil.RequiresRoot(t)
	root := filepath.Join(t.TempDir(), "layers")
	s, err := New(root, testIDs)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.ImportTar(context.Background(), tarOf(t, file("f", 0o644, "x")), CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Simulate crashes: a half-extracted tmp dir, a layer dir renamed into
	// place without metadata, a metadata temp file.
	half, _ := s.TempDir("tar-")
	os.WriteFile(filepath.Join(half, "partial"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(root, "0123456789ab"), 0o755)
	os.WriteFile(filepath.Join(root, ".0123456789ab.json12345"), []byte("{"), 0o600)

	s2, err := New(root, testIDs)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{l.ID[:shortLen], l.ID[:shortLen] + ".json", tmpName}
	if len(names) != len(want) || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Errorf("root holds %v, want %v", names, want)
	}
	assertTmpEmpty(t, s2)
	got, err := s2.Get(l.ID[:shortLen])
	if err != nil || got.ID != l.ID || got.Digest != l.Digest || got.Path != l.Path || !got.CreatedAt.Equal(l.CreatedAt) {
		t.Errorf("after reopen Get = %+v %v, want %+v", got, err, l)
	}
}

func TestCreateFromDirAndRemove(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	base, err := s.ImportTar(ctx, tarOf(t, dir("./", 0o755), file("base", 0o644, "b")), CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Same filesystem: adopted by rename.
	up, _ := s.TempDir("upper-")
	mkTree(t, up)
	want, _ := TreeHash(up, testIDs)
	var before unix.Stat_t
	unix.Lstat(filepath.Join(up, "etc/a"), &before)
	l, err := s.CreateFromDir(ctx, up, CreateOptions{Parent: base.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(up); !os.IsNotExist(err) {
		t.Errorf("src still exists: %v", err)
	}
	if l.Digest != want || l.Parent != base.ID {
		t.Errorf("layer %+v, want digest %s", l, want)
	}
	if st := lstat(t, filepath.Join(l.Path, "etc/a")); st.Ino != before.Ino {
		t.Errorf("same-filesystem adopt copied instead of renaming")
	}
	// Another filesystem (tmpfs): copied, everything preserved; identical
	// content on the same parent is the same layer.
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		other, err := os.MkdirTemp("/dev/shm", "layers-test-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(other)
		mkTree(t, other)
		l2, err := s.CreateFromDir(ctx, other, CreateOptions{Parent: base.ID})
		if err != nil {
			t.Fatal(err)
		}
		if l2.ID != l.ID {
			t.Errorf("cross-filesystem copy hashes differently: %s vs %s", l2.ID, l.ID)
		}
		if _, err := os.Lstat(other); !os.IsNotExist(err) {
			t.Errorf("src still exists: %v", err)
		}
	}
	// Unmapped owners are refused.
	bad, _ := s.TempDir("bad-")
	os.WriteFile(filepath.Join(bad, "rootfile"), nil, 0o644)
	if _, err := s.CreateFromDir(ctx, bad, CreateOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unmapped owner: err = %v", err)
	}
	if _, err := s.CreateFromDir(ctx, t.TempDir(), CreateOptions{Parent: "nonexistent-parent"}); !errdefs.IsNotFound(err) {
		t.Errorf("missing parent: err = %v", err)
	}

	// Remove: refused while stacked on or referenced.
	if err := s.Remove(ctx, base.ID); !errdefs.IsConflict(err) {
		t.Errorf("remove base with child: %v", err)
	}
	if err := s.Ref(ctx, l.ID, "template/x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, l.ID); !errdefs.IsConflict(err) {
		t.Errorf("remove referenced: %v", err)
	}
	usage, _ := s.DiskUsage(ctx)
	if usage <= 0 {
		t.Errorf("DiskUsage = %d", usage)
	}
	if err := s.Unref(ctx, l.ID, "template/x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, base.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(l.ID); !errdefs.IsNotFound(err) {
		t.Errorf("Get after remove: %v", err)
	}
	if _, err := os.Lstat(l.Path); !os.IsNotExist(err) {
		t.Errorf("layer dir left: %v", err)
	}
	if n := len(s.List()); n != 0 {
		t.Errorf("%d layers left", n)
	}
	assertTmpEmpty(t, s)
}

func TestImportPath(t *testing.T) {
	s := newStore(t)
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub"), 0o750)
	os.WriteFile(filepath.Join(src, "sub/run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "pw"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o644)
	l, err := s.ImportPath(context.Background(), src, "/opt/app", CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for rel, mode := range map[string]uint32{".": 0o755, "opt": 0o755, "opt/app/sub": 0o750, "opt/app/sub/run.sh": 0o755} {
		st := lstat(t, filepath.Join(l.Path, rel))
		if st.Uid != 100000 || st.Gid != 100000 || st.Mode&0o7777 != mode {
			t.Errorf("%s: %d:%d mode %o, want 100000 and %o", rel, st.Uid, st.Gid, st.Mode&0o7777, mode)
		}
	}
	if target, _ := os.Readlink(filepath.Join(l.Path, "opt/app/pw")); target != "/etc/passwd" {
		t.Errorf("symlink followed or lost: %q", target)
	}
	if _, err := os.Lstat(filepath.Join(l.Path, "opt/app/fifo")); !os.IsNotExist(err) {
		t.Errorf("fifo copied")
	}
	// A single file.
	l2, err := s.ImportPath(context.Background(), filepath.Join(src, "sub/run.sh"), "/usr/local/bin/run", CreateOptions{Parent: l.ID})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(l2.Path, "usr/local/bin/run")); err != nil || string(b) != "#!/bin/sh\n" {
		t.Errorf("file copy: %q %v", b, err)
	}
	for _, dst := range []string{"relative", "/", "/a/../b"} {
		if _, err := s.ImportPath(context.Background(), src, dst, CreateOptions{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("dst %q: err = %v", dst, err)
		}
	}
	if _, err := s.ImportPath(context.Background(), filepath.Join(src, "missing"), "/x", CreateOptions{}); !errdefs.IsNotFound(err) {
		t.Errorf("missing src: %v", err)
	}
}
