package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// DefaultMaxDepth is the chain depth above which Bound squashes. Overlay
// stacks up to 500 lower dirs, but every lookup of a missing name walks
// them all, and the classic mount options must fit in one page.
const DefaultMaxDepth = 32

// SquashOptions are options of Squash.
type SquashOptions struct {
	// Keep is how many bottom layers of the chain are kept as they are
	// (for example a large template base). 0 squashes the whole chain into
	// one base layer.
	Keep int
}

// Squash returns a layer on top of the chain's Keep bottom-most layers
// whose merged view equals that of the whole chain of id: overlay
// semantics are applied top-down (an upper entry replaces a lower one, a
// whiteout removes it, an opaque directory hides the lower directory's
// entries), with the whiteouts and opaque markers that still hide something
// in the kept layers preserved. With Keep 0 the result is a base layer free
// of overlay metadata. When the chain has at most Keep+1 layers, id's own
// layer is returned. The chain of id is not modified; the new layer is
// built with the store's Driver in the store's scratch space and is
// invisible until committed.
//
// Hardlinks between files of different layers of the squashed part become
// separate files, as they are in a merged overlay view.
func (s *Store) Squash(ctx context.Context, id string, opts SquashOptions) (Layer, error) {
	chain, err := s.Chain(id)
	if err != nil {
		return Layer{}, fmt.Errorf("squashing %s: %w", id, err)
	}
	if opts.Keep < 0 {
		return Layer{}, fmt.Errorf("squashing %s: negative keep: %w", id, errdefs.ErrInvalidArgument)
	}
	if len(chain) <= opts.Keep+1 {
		return chain[0], nil
	}
	group := chain[:len(chain)-opts.Keep] // top-most first
	parent := ""
	if opts.Keep > 0 {
		parent = chain[len(group)].ID
	}
	holder, err := s.TempDir("squash-")
	if err != nil {
		return Layer{}, err
	}
	defer os.RemoveAll(holder)
	acc := filepath.Join(holder, "l")
	if err := s.driver.Clone(ctx, group[len(group)-1].Path, acc); err != nil {
		return Layer{}, fmt.Errorf("squashing %s: %w", id, err)
	}
	for i := len(group) - 2; i >= 0; i-- {
		if err := s.applyLayer(ctx, group[i].Path, acc); err != nil {
			return Layer{}, fmt.Errorf("squashing %s: applying layer %s: %w", id, group[i].ID, err)
		}
	}
	var kept []string
	for _, l := range chain[len(group):] {
		kept = append(kept, l.Path)
	}
	if err := pruneWhiteouts(ctx, acc, kept); err != nil {
		return Layer{}, fmt.Errorf("squashing %s: %w", id, err)
	}
	if parent == "" {
		if err := stripOverlayMeta(ctx, acc); err != nil {
			return Layer{}, fmt.Errorf("squashing %s: %w", id, err)
		}
	}
	l, err := s.commit(ctx, acc, CreateOptions{Parent: parent})
	if err != nil {
		return Layer{}, fmt.Errorf("squashing %s: %w", id, err)
	}
	s.log.Info("layer chain squashed", "from", id, "depth", len(chain), "to", l.ID, "kept", opts.Keep)
	return l, nil
}

// Bound returns id's layer when its chain is at most max deep (0: the
// store's MaxDepth), else a squash of the chain that keeps only its
// bottom-most layer (the template base, usually the largest) as it is, for
// a depth of 2 (1 when max is 1).
func (s *Store) Bound(ctx context.Context, id string, max int) (Layer, error) {
	if max <= 0 {
		max = s.MaxDepth()
	}
	chain, err := s.Chain(id)
	if err != nil {
		return Layer{}, err
	}
	if len(chain) <= max {
		return chain[0], nil
	}
	keep := 1
	if max == 1 {
		keep = 0
	}
	return s.Squash(ctx, id, SquashOptions{Keep: keep})
}

// applyLayer puts the layer directory upper over acc, in place, so that acc
// alone means what upper stacked on acc means.
func (s *Store) applyLayer(ctx context.Context, upper, acc string) error {
	inodes := map[uint64]string{} // inode in upper -> rel path of its first link
	var dirs []string             // rel paths whose times are set last
	err := filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, path)
		if err != nil {
			return err
		}
		target := filepath.Join(acc, rel)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		var old unix.Stat_t
		oerr := unix.Lstat(target, &old)
		if oerr != nil && !errors.Is(oerr, unix.ENOENT) {
			return &os.PathError{Op: "lstat", Path: target, Err: oerr}
		}
		exists := oerr == nil
		oldDir := exists && old.Mode&unix.S_IFMT == unix.S_IFDIR

		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if exists {
				if err := os.RemoveAll(target); err != nil {
					return err
				}
			}
			if st.Nlink > 1 && st.Mode&unix.S_IFMT == unix.S_IFREG {
				if first, ok := inodes[st.Ino]; ok {
					return os.Link(filepath.Join(acc, first), target)
				}
				inodes[st.Ino] = rel
			}
			return s.driver.Clone(ctx, path, target)
		}

		// A directory.
		if opaque(path) && rel != "." {
			// Hides everything below: replace acc's directory wholesale.
			if exists {
				if err := os.RemoveAll(target); err != nil {
					return err
				}
			}
			if err := s.driver.Clone(ctx, path, target); err != nil {
				return err
			}
			return filepath.SkipDir
		}
		switch {
		case oldDir:
			// Merged: the upper directory's own metadata wins; acc's
			// opaque marker (it hides kept layers) stays.
			if err := syncMeta(path, target, &st); err != nil {
				return err
			}
		default:
			if exists {
				if err := os.RemoveAll(target); err != nil {
					return err
				}
			}
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			if err := syncMeta(path, target, &st); err != nil {
				return err
			}
			if exists {
				// A directory over a file or a whiteout hides what lies
				// below in the kept layers.
				if err := unix.Lsetxattr(target, xattrOpaque, []byte("y"), 0); err != nil {
					return &os.PathError{Op: "lsetxattr", Path: target, Err: err}
				}
			}
		}
		dirs = append(dirs, rel)
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, dirs[i]), &st); err != nil {
			return err
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(acc, dirs[i]), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: dirs[i], Err: err}
		}
	}
	return nil
}

// syncMeta gives the directory dst the owner, permission bits and
// non-overlay xattrs of src (whose stat is st).
func syncMeta(src, dst string, st *unix.Stat_t) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	names, err := listxattr(dst)
	if err != nil {
		return err
	}
	for _, n := range names {
		if isOverlayXattr(n) {
			continue
		}
		if err := unix.Lremovexattr(dst, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return &os.PathError{Op: "lremovexattr " + n, Path: dst, Err: err}
		}
	}
	names, err = listxattr(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if isOverlayXattr(n) {
			continue
		}
		v, err := getxattr(src, n)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, n, v, 0); err != nil {
			return &os.PathError{Op: "lsetxattr " + n, Path: dst, Err: err}
		}
	}
	return nil
}

func isOverlayXattr(name string) bool {
	return strings.HasPrefix(name, "user.overlay.") || strings.HasPrefix(name, "trusted.overlay.")
}

// stripOverlayMeta removes whiteouts and overlay xattrs from the tree at
// dir, which becomes a base layer: nothing lies below it to hide.
func stripOverlayMeta(ctx context.Context, dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return nil
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				return os.Remove(path)
			}
		}
		names, err := listxattr(path)
		if err != nil {
			return err
		}
		for _, n := range names {
			if isOverlayXattr(n) {
				if err := unix.Lremovexattr(path, n); err != nil && !errors.Is(err, unix.ENODATA) {
					return &os.PathError{Op: "lremovexattr " + n, Path: path, Err: err}
				}
			}
		}
		return nil
	})
}

// pruneWhiteouts removes the whiteouts of the squashed tree at dir that
// hide nothing in the kept layers below (paths, top-most first): overlayfs
// lists a directory that exists in one layer only without filtering
// whiteouts, so a stray one would show up as a name that cannot be opened.
func pruneWhiteouts(ctx context.Context, dir string, kept []string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.Type()&fs.ModeCharDevice == 0 {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Rdev != 0 {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		needed := false
		for _, k := range kept {
			var kst unix.Stat_t
			if err := unix.Lstat(filepath.Join(k, rel), &kst); err == nil && !(kst.Mode&unix.S_IFMT == unix.S_IFCHR && kst.Rdev == 0) {
				needed = true
				break
			}
		}
		for a := filepath.Dir(rel); needed && a != "."; a = filepath.Dir(a) {
			if opaque(filepath.Join(dir, a)) {
				needed = false // everything below is hidden already
			}
		}
		if needed {
			return nil
		}
		return os.Remove(path)
	})
}
