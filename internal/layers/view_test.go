package layers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/testutil"
)

// mkSpecTree creates files (content after '='), dirs (trailing '/'), symlinks
// ("path->target"), whiteouts ("path!") and opaque dirs ("path/!") under root.
func mkSpecTree(t *testing.T, root string, specs ...string) {
	t.Helper()
	for _, s := range specs {
		var err error
		switch {
		case strings.HasSuffix(s, "/!"):
			p := filepath.Join(root, strings.TrimSuffix(s, "/!"))
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = unix.Setxattr(p, xattrOpaque, []byte("y"), 0)
			}
		case strings.HasSuffix(s, "!"):
			p := filepath.Join(root, strings.TrimSuffix(s, "!"))
			_ = os.MkdirAll(filepath.Dir(p), 0o755)
			err = unix.Mknod(p, unix.S_IFCHR, 0)
		case strings.HasSuffix(s, "/"):
			err = os.MkdirAll(filepath.Join(root, s), 0o755)
		case strings.Contains(s, "->"):
			p, target, _ := strings.Cut(s, "->")
			_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
			err = os.Symlink(target, filepath.Join(root, p))
		default:
			p, data, _ := strings.Cut(s, "=")
			_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
			err = os.WriteFile(filepath.Join(root, p), []byte(data), 0o644)
		}
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func TestMergedViewAndDiff(t *testing.T) {
	testutil.RequiresRoot(t) // whiteouts are device nodes
	ctx := context.Background()
	base := t.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	mkSpecTree(t, lower, "a/x=1", "a/y=2", "b/z=3", "c=file", "d/inner=4", "e/deep/f=5", "same=x", "ln->/etc/passwd", "keep=k")
	mkSpecTree(t, upper, "a/x!", "b/!", "b/new=n", "c/", "c/under=u", "d!", "same=y", "ln->/etc/shadow", "e/deep/g=6")

	lv, err := MergedView(ctx, []string{lower}, idrange.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	mv, err := MergedView(ctx, []string{upper, lower}, idrange.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/", "/a", "/a/y", "/b", "/b/new", "/c", "/c/under", "/e", "/e/deep", "/e/deep/f", "/e/deep/g", "/keep", "/ln", "/same"}
	if got := mv.Paths(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("merged paths\n got %v\nwant %v", got, want)
	}
	if e := mv.Get("/c"); e.Type != TypeDir {
		t.Errorf("/c is %s, want dir (upper dir over lower file)", e.Type)
	}
	changes, err := Diff(ctx, lv, mv)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Kind[:1]+" "+c.Path)
	}
	wantCh := []string{"d /a/x", "a /b/new", "d /b/z", "m /c", "a /c/under", "d /d", "d /d/inner", "a /e/deep/g", "m /ln", "m /same"}
	if strings.Join(got, ",") != strings.Join(wantCh, ",") {
		t.Fatalf("changes\n got %v\nwant %v", got, wantCh)
	}

	// Equal content in different files is no change; the hash agrees.
	other := filepath.Join(base, "copy")
	mkSpecTree(t, other, "a/y=2", "b/new=n", "c/under=u", "e/deep/f=5", "e/deep/g=6", "keep=k", "ln->/etc/shadow", "same=y")
	cv, err := MergedView(ctx, []string{other}, idrange.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := Diff(ctx, mv, cv); err != nil || len(ch) != 0 {
		t.Fatalf("diff of equal trees: %v %v", ch, err)
	}
	h1, err := mv.Hash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := cv.Hash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h1 != h2 {
		t.Fatalf("hashes of equal views differ: %s %s", h1, h2)
	}
	if err := os.WriteFile(filepath.Join(other, "keep"), []byte("K"), 0o644); err != nil {
		t.Fatal(err)
	}
	cv2, _ := MergedView(ctx, []string{other}, idrange.IDMap{})
	if h3, _ := cv2.Hash(ctx); h3 == h1 {
		t.Fatal("hash did not change with a file's content")
	}
}

func TestMergedViewNeverFollowsSymlinks(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	mkSpecTree(t, outside, "secret=s")
	layer := filepath.Join(base, "layer")
	mkSpecTree(t, layer, "escape->"+outside, "f=1")
	v, err := MergedView(ctx, []string{layer}, idrange.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Get("/escape/secret") != nil {
		t.Fatal("the view followed a symlink out of the layer")
	}
	if e := v.Get("/escape"); e == nil || e.Type != TypeSymlink || e.Target != outside {
		t.Fatalf("symlink entry %+v", e)
	}
}
