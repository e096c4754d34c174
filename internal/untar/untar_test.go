package untar

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{
		"a": "a", "./a": "a", "a/b/": "a/b", "a//b": "a/b", "./": ".", ".": ".", "": ".",
		"../a": "", "a/../b": "", "a/..": "", "/a": "", "a\x00": "", string(make([]byte, MaxNameLen+1)): "",
	} {
		got, err := CleanName(in)
		if want == "" {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("CleanName(%q) = %q, %v; want an invalid argument", in, got, err)
			}
		} else if got != want || err != nil {
			t.Errorf("CleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// extract runs Extract on a fresh root and returns the root's path.
func extract(t *testing.T, opts Options, tarball []byte) (string, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return root, Extract(context.Background(), fd, bytes.NewReader(tarball), opts)
}

func tarOf(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Linkname))
		}
		data := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Linkname = ""
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// reg is a regular file entry whose content is body (carried in Linkname
// until tarOf writes it).
func reg(name, body string, mode int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Linkname: body, Mode: mode}
}

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// The zero Options extract files, directories and symlinks with fixed
// modes and refuse links, FIFOs and devices.
func TestZeroOptions(t *testing.T) {
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	root, err := extract(t, Options{}, tarOf(t,
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o777, ModTime: mtime},
		reg("d/f", "hi", 0o4755),
		&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
	))
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, root+"/d/f"); m != 0o600 {
		t.Errorf("file mode %v, want 0600", m)
	}
	if m := mode(t, root+"/d"); m.Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", m)
	}
	if fi, _ := os.Lstat(root + "/d"); !fi.ModTime().Equal(mtime) {
		t.Errorf("dir mtime %v, want %v", fi.ModTime(), mtime)
	}
	if l, err := os.Readlink(root + "/d/l"); err != nil || l != "/etc/passwd" {
		t.Errorf("symlink %q, %v", l, err)
	}
	for name, h := range map[string]*tar.Header{
		"hard link": {Name: "h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		"fifo":      {Name: "p", Typeflag: tar.TypeFifo, Mode: 0o600},
		"char":      {Name: "c", Typeflag: tar.TypeChar},
	} {
		if _, err := extract(t, Options{}, tarOf(t, h)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want an invalid argument", name, err)
		}
	}
}

// Perm, Owner, Xattrs, Whiteouts, SetRoot and the Skip actions.
func TestLayerOptions(t *testing.T) {
	testutil.RequiresRoot(t)
	const base = 100000
	opts := Options{
		HardLinks: Create, FIFOs: Skip, Devices: Skip, Perm: 0o7777,
		Owner: func(uid, gid int) (int, int, error) {
			if uid >= 1000 || gid >= 1000 {
				return 0, 0, fmt.Errorf("owner %d:%d: %w", uid, gid, errdefs.ErrInvalidArgument)
			}
			return base + uid, base + gid, nil
		},
		Xattrs: true, Whiteouts: true, SetRoot: true,
	}
	root, err := extract(t, opts, tarOf(t,
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o751},
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 5, Gid: 6,
			PAXRecords: map[string]string{"SCHILY.xattr.user.a": "1", "SCHILY.xattr.security.capability": "x", "SCHILY.xattr.trusted.overlay.opaque": "y"}},
		reg("d/f", "hi", 0o4755),
		&tar.Header{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		&tar.Header{Name: "d/p", Typeflag: tar.TypeFifo, Mode: 0o600},
		&tar.Header{Name: "d/b", Typeflag: tar.TypeBlock, Devmajor: 7},
		&tar.Header{Name: "d/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		&tar.Header{Name: "d/wh", Typeflag: tar.TypeChar},
		reg("d/.wh.gone", "", 0o644),
		reg("e/.wh..wh..opq", "", 0o644),
	))
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	must(t, unix.Lstat(root+"/d/f", &st))
	if st.Uid != base || st.Mode&0o7777 != 0o4755 || st.Nlink != 2 {
		t.Errorf("d/f: uid %d mode %o links %d; want %d, 4755, 2", st.Uid, st.Mode&0o7777, st.Nlink, base)
	}
	must(t, unix.Lstat(root+"/d", &st))
	if st.Uid != base+5 || st.Gid != base+6 || st.Mode&0o777 != 0o755 {
		t.Errorf("d: %d:%d %o", st.Uid, st.Gid, st.Mode&0o777)
	}
	must(t, unix.Lstat(root, &st))
	if st.Uid != base || st.Mode&0o777 != 0o751 {
		t.Errorf("root: uid %d mode %o; want %d, 751", st.Uid, st.Mode&0o777, base)
	}
	for _, p := range []string{"d/wh", "d/gone"} {
		if err := unix.Lstat(root+"/"+p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s is not a whiteout: %v", p, err)
		}
	}
	for _, p := range []string{"d/p", "d/b", "d/null", "d/.wh.gone"} {
		if _, err := os.Lstat(root + "/" + p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want skipped", p, err)
		}
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(root+"/d", "user.a", buf); err != nil || string(buf[:n]) != "1" {
		t.Errorf("user.a: %q %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(root+"/d", "security.capability", buf); err == nil {
		t.Error("security.capability kept")
	}
	for _, p := range []string{"d", "e"} {
		if n, err := unix.Lgetxattr(root+"/"+p, OpaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
			t.Errorf("%s: opaque %q %v", p, buf[:n], err)
		}
	}
	if _, err := extract(t, opts, tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Uid: 1000})); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unmapped owner: %v", err)
	}
	if _, err := extract(t, opts, tarOf(t, &tar.Header{Name: "./", Typeflag: tar.TypeSymlink, Linkname: "x"})); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a symlink as the root: %v", err)
	}
}

// A later entry replaces an earlier one; a directory in the way is
// refused; CheckDir sees every parent; a refused entry leaves nothing.
func TestReplaceAndCheckDir(t *testing.T) {
	var seen []string
	opts := Options{Perm: 0o777, CheckDir: func(fd int, rel string) error {
		seen = append(seen, rel)
		if rel == "no/x" {
			return fmt.Errorf("refused: %w", errdefs.ErrInvalidArgument)
		}
		return nil
	}}
	root, err := extract(t, opts, tarOf(t,
		&tar.Header{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		reg("a", "file", 0o644),
		reg("b", "old", 0o644),
		&tar.Header{Name: "b", Typeflag: tar.TypeSymlink, Linkname: "a"},
	))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(root + "/a"); err != nil || string(b) != "file" {
		t.Errorf("a: %q %v", b, err)
	}
	if l, err := os.Readlink(root + "/b"); err != nil || l != "a" {
		t.Errorf("b: %q %v", l, err)
	}
	if len(seen) != 4 {
		t.Errorf("CheckDir saw %v", seen)
	}
	if _, err := extract(t, opts, tarOf(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, reg("d", "x", 0o644))); !errdefs.IsAlreadyExists(err) {
		t.Errorf("file over a directory: %v", err)
	}
	root, err = extract(t, opts, tarOf(t, reg("no/x", "x", 0o644)))
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("CheckDir refusal: %v", err)
	}
	if ents, _ := os.ReadDir(root + "/no"); len(ents) != 0 {
		t.Errorf("refused entry left %v", ents)
	}
}

// The shared table, under the options each caller uses.
func TestRules(t *testing.T) {
	testutil.RequiresRoot(t)
	id := func(uid, gid int) (int, int, error) { return uid, gid, nil }
	profiles := []struct {
		name string
		opts Options
		want func(rawtar.Rule) error
	}{
		{"layer", Options{HardLinks: Create, FIFOs: Skip, Devices: Skip, Perm: 0o7777, Owner: id, Xattrs: true, Whiteouts: true, SetRoot: true, ReservePercent: 5},
			func(r rawtar.Rule) error { return r.Layer }},
		{"image", Options{ReservePercent: 5}, func(r rawtar.Rule) error { return r.Image }},
		{"upload", Options{HardLinks: Create, FIFOs: Create, Perm: 0o7777, Owner: id, OwnerBestEffort: true},
			func(r rawtar.Rule) error { return r.Upload }},
	}
	for _, p := range profiles {
		for _, r := range rawtar.Rules() {
			_, err := extract(t, p.opts, r.Tar)
			if want := p.want(r); (want == nil && err != nil) || !errors.Is(err, want) {
				t.Errorf("%s, %s: %v, want %v", p.name, r.Name, err, want)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Umask clears bits from every mode the archive gives (and from parents
// made for an entry); OwnerWritableDirs keeps every directory writable
// by its owner, so that its entries can be written into it.
func TestUmaskAndOwnerWritableDirs(t *testing.T) {
	old := unix.Umask(0) // the kernel's umask would hide what Umask does
	defer unix.Umask(old)
	root, err := extract(t, Options{Perm: 0o777, Umask: 0o027, OwnerWritableDirs: true}, tarOf(t,
		&tar.Header{Name: "ro/", Typeflag: tar.TypeDir, Mode: 0o555},
		&tar.Header{Name: "ro/f", Typeflag: tar.TypeReg, Mode: 0o4777, Linkname: "x"},
		&tar.Header{Name: "made/g", Typeflag: tar.TypeReg, Mode: 0o666, Linkname: "y"},
	))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"ro": 0o750, "ro/f": 0o750, "made": 0o750, "made/g": 0o640} {
		st, err := os.Stat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != want {
			t.Errorf("%s: mode %v, want %v", name, got, want)
		}
	}
	// Without OwnerWritableDirs a directory keeps the archive's mode.
	root, err = extract(t, Options{Perm: 0o777}, tarOf(t, &tar.Header{Name: "ro/", Typeflag: tar.TypeDir, Mode: 0o555}))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(root, "ro")); err != nil || st.Mode().Perm() != 0o555 {
		t.Errorf("ro without OwnerWritableDirs: %v, %v", st, err)
	}
}
