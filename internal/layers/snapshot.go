package layers

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// CreateFromCopy makes, with the store's Driver, an exact copy of src (for example the overlay upper
// directory of a running, frozen sandbox) and commits it as a new immutable
// layer on top of opts.Parent. Unlike CreateFromDir, src is left untouched.
// The copy keeps owners, permission bits, timestamps, xattrs (the
// user.overlay.* ones included), whiteouts (character devices 0:0),
// hardlinks and symlinks; sockets are skipped. Until the layer's metadata is
// written it is invisible: an interrupted copy leaves only scratch content
// that New removes. When an identical layer exists already, it is returned.
func (s *Store) CreateFromCopy(ctx context.Context, src string, opts CreateOptions) (Layer, error) {
	fi, err := os.Lstat(src)
	if err != nil {
		return Layer{}, fmt.Errorf("copying %s into a layer: %w", src, err)
	}
	if !fi.IsDir() {
		return Layer{}, fmt.Errorf("copying %s into a layer: not a directory: %w", src, errdefs.ErrInvalidArgument)
	}
	holder, err := s.TempDir("copy-")
	if err != nil {
		return Layer{}, err
	}
	defer os.RemoveAll(holder)
	dst := filepath.Join(holder, "l")
	if err := s.driver.Clone(ctx, src, dst); err != nil {
		return Layer{}, fmt.Errorf("copying %s into a layer: %w", src, err)
	}
	if err := s.ownWhiteouts(dst); err != nil {
		return Layer{}, fmt.Errorf("copying %s into a layer: %w", src, err)
	}
	return s.commit(ctx, dst, opts)
}

// ownWhiteouts gives whiteouts (character devices 0:0) of dir owned
// outside the store's id map to its root: an overlay mounted by host root
// without an idmapped upper (the gvisor backend's, whose gofer deletes
// files as the sandbox's root) makes them as host root. A whiteout's owner
// means nothing; any other file owned outside the map is still refused
// when the layer is hashed.
func (s *Store) ownWhiteouts(dir string) error {
	if s.ids.Size == 0 {
		return nil
	}
	lo, hi := uint64(s.ids.HostID), uint64(s.ids.HostID)+uint64(s.ids.Size)
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeCharDevice == 0 {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			return nil
		}
		if uint64(st.Uid) >= lo && uint64(st.Uid) < hi && uint64(st.Gid) >= lo && uint64(st.Gid) < hi {
			return nil
		}
		return unix.Lchown(path, int(s.ids.HostID), int(s.ids.HostID))
	})
}

// ByPath returns the layer whose directory is path (as found in a Paths
// result or a sandbox's lower dirs). It fails with errdefs.ErrNotFound when
// path is not a layer directory of this store.
func (s *Store) ByPath(path string) (Layer, error) {
	dir, name := filepath.Split(filepath.Clean(path))
	if filepath.Clean(dir) != s.root || len(name) != shortLen || strings.Trim(name, "0123456789abcdef") != "" {
		return Layer{}, fmt.Errorf("%s is not a layer of the store: %w", path, errdefs.ErrNotFound)
	}
	return s.Get(name)
}
