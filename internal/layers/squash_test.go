package layers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// mkLayerDir makes a layer directory from specs: "path=content" files,
// "path/" dirs, "path->target" symlinks, "path!" whiteouts, "path/!"
// opaque dirs, "path=>other" hardlinks; everything owned by mapped root.
func mkLayerDir(t *testing.T, root string, specs ...string) {
	t.Helper()
	must := func(s string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	must("root", os.MkdirAll(root, 0o755))
	for _, s := range specs {
		switch {
		case strings.HasSuffix(s, "/!"):
			p := filepath.Join(root, strings.TrimSuffix(s, "/!"))
			must(s, os.MkdirAll(p, 0o755))
			must(s, unix.Lsetxattr(p, xattrOpaque, []byte("y"), 0))
		case strings.HasSuffix(s, "!"):
			p := filepath.Join(root, strings.TrimSuffix(s, "!"))
			must(s, os.MkdirAll(filepath.Dir(p), 0o755))
			must(s, unix.Mknod(p, unix.S_IFCHR, 0))
		case strings.HasSuffix(s, "/"):
			must(s, os.MkdirAll(filepath.Join(root, s), 0o755))
		case strings.Contains(s, "=>"):
			p, old, _ := strings.Cut(s, "=>")
			must(s, os.Link(filepath.Join(root, old), filepath.Join(root, p)))
		case strings.Contains(s, "->"):
			p, target, _ := strings.Cut(s, "->")
			must(s, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
			must(s, os.Symlink(target, filepath.Join(root, p)))
		default:
			p, data, _ := strings.Cut(s, "=")
			must(s, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
			must(s, os.WriteFile(filepath.Join(root, p), []byte(data), 0o644))
		}
	}
	must("chown", filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 100000, 100000)
	}))
}

// stack creates layers from specs, bottom first, and returns the top.
func stack(t *testing.T, s *Store, layers ...[]string) Layer {
	t.Helper()
	var top Layer
	for i, specs := range layers {
		dir, err := s.TempDir("t-")
		if err != nil {
			t.Fatal(err)
		}
		mkLayerDir(t, filepath.Join(dir, "l"), specs...)
		top, err = s.CreateFromDir(context.Background(), filepath.Join(dir, "l"), CreateOptions{Parent: top.ID})
		if err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		os.RemoveAll(dir)
	}
	return top
}

// mergedHash mounts the chain of id read-only with overlayfs (as a sandbox
// sees it) and returns the TreeHash of the merged view.
func mergedHash(t *testing.T, s *Store, id string) string {
	t.Helper()
	paths, err := s.Paths(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 1 {
		h, err := TreeHash(paths[0], testIDs)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "userxattr,lowerdir="+strings.Join(paths, ":")); err != nil {
		t.Fatalf("mounting overlay: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	h, err := TreeHash(mnt, testIDs)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var squashLayers = [][]string{
	{"bin/sh=busybox", "bin/ls=ls", "etc/passwd=root", "etc/conf/a=1", "etc/conf/b=2", "usr/lib/x=x", "opt/f=file", "var/d/", "home/h=h", "home/hl=>home/h"},
	{"bin/ls!", "etc/conf/!", "etc/conf/c=3", "opt/f/", "opt/f/in=inside", "var/d=now a file", "root/new=n"},
	{"etc/passwd=root2", "usr/lib!", "tmp/x=1", "tmp/y->x", "home/h=changed"},
	{"usr/lib/", "usr/lib/y=fresh", "tmp/x!", "etc/conf/d=4", "root/new!"},
	{"bin/ls=back", "opt/f!", "root/new/deep=d", "srv/big=" + strings.Repeat("z", 1<<16)},
}

func TestSquashKeepsMergedView(t *testing.T) {
	s := newStore(t)
	top := stack(t, s, squashLayers...)
	want := mergedHash(t, s, top.ID)
	for _, keep := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("keep%d", keep), func(t *testing.T) {
			sq, err := s.Squash(context.Background(), top.ID, SquashOptions{Keep: keep})
			if err != nil {
				t.Fatal(err)
			}
			chain, err := s.Chain(sq.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != keep+1 {
				t.Fatalf("squashed chain depth %d, want %d", len(chain), keep+1)
			}
			if got := mergedHash(t, s, sq.ID); got != want {
				t.Fatalf("merged view after squash %s, want %s", got, want)
			}
			if keep == 0 {
				// A base layer carries no overlay metadata.
				filepath.Walk(sq.Path, func(p string, fi os.FileInfo, err error) error {
					if fi.Mode()&os.ModeCharDevice != 0 {
						t.Errorf("whiteout left in base: %s", p)
					}
					if opaque(p) {
						t.Errorf("opaque marker left in base: %s", p)
					}
					return nil
				})
			}
		})
	}
	// Bound squashes only beyond the depth limit.
	l, err := s.Bound(context.Background(), top.ID, 5)
	if err != nil || l.ID != top.ID {
		t.Fatalf("Bound under the limit = %s, %v", l.ID, err)
	}
	l, err = s.Bound(context.Background(), top.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	if chain, _ := s.Chain(l.ID); len(chain) != 2 || mergedHash(t, s, l.ID) != want {
		t.Fatalf("Bound(3) gave a chain of %d", len(chain))
	}
	assertTmpEmpty(t, s)
}

func TestGC(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	base := stack(t, s, []string{"a=1"})
	kept := stack(t, s, []string{"a=1"}, []string{"b=2"}) // on base
	root := stack(t, s, []string{"a=1"}, []string{"c=3"}) // on base, a root
	garbage := stack(t, s, []string{"a=1"}, []string{"b=2"}, []string{"d=4"}, []string{"e=5"})
	if err := s.Ref(ctx, kept.ID, "template/t"); err != nil {
		t.Fatal(err)
	}
	// Everything is young: nothing goes.
	res, err := s.GC(ctx, GCOptions{MinAge: time.Hour})
	if err != nil || len(res.Removed) != 0 {
		t.Fatalf("GC of young layers removed %v, %v", res.Removed, err)
	}
	res, err = s.GC(ctx, GCOptions{Roots: []string{root.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 2 || res.Kept != 3 {
		t.Fatalf("GC removed %v, kept %d; want the 2 layers above %s", res.Removed, res.Kept, kept.ID)
	}
	for _, l := range []Layer{base, kept, root} {
		if _, err := s.Get(l.ID); err != nil {
			t.Errorf("kept layer %s: %v", l.ID, err)
		}
		if _, err := os.Stat(l.Path); err != nil {
			t.Errorf("kept layer dir: %v", err)
		}
	}
	if _, err := s.Get(garbage.ID); !errdefs.IsNotFound(err) {
		t.Errorf("garbage layer still there: %v", err)
	}
	if _, err := os.Stat(garbage.Path); !os.IsNotExist(err) {
		t.Errorf("garbage dir still there: %v", err)
	}
	// Dropping the last reference and root makes the rest garbage.
	if err := s.Unref(ctx, kept.ID, "template/t"); err != nil {
		t.Fatal(err)
	}
	res, err = s.GC(ctx, GCOptions{})
	if err != nil || res.Kept != 0 || len(res.Removed) != 3 {
		t.Fatalf("final GC: %+v, %v", res, err)
	}
	assertTmpEmpty(t, s)
	// A restarted store sees what GC left.
	s2, err := New(s.Root(), testIDs)
	if err != nil || len(s2.List()) != 0 {
		t.Fatalf("reopened store: %d layers, %v", len(s2.List()), err)
	}
}
