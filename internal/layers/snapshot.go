package layers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	return s.commit(ctx, dst, opts)
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
