package layers

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
)

// ImportTar extracts the tar stream r (for example mmdebstrap's output) into
// a new layer on top of opts.Parent.
//
//   - Ownership: tar uid/gid N becomes host id HostID+N; ids >= the map's
//     Size are refused (errdefs.ErrInvalidArgument).
//   - Kept: regular files, directories, symlinks, hardlinks (to an earlier
//     entry of the same layer), permission bits including setuid/setgid and
//     sticky, modification times, user.* xattrs. Setuid binaries are
//     harmless here: they are owned by mapped ids and so can never gain
//     more than the sandbox's own user namespace has.
//   - Dropped: security.capability xattrs (file capabilities cannot be
//     honoured for files under a user namespace mapping without v3
//     capabilities carrying the namespace root id; binaries relying on them,
//     like ping, fall back or need root inside), ACLs and trusted.*/
//     security.* xattrs (they carry host-level meaning), device nodes,
//     fifos and sockets (the sandbox gets its /dev at run time), PAX
//     global headers.
//   - Refused (errdefs.ErrInvalidArgument): sparse entries (old-GNU 'S',
//     PAX GNU.sparse.*: see package tarcheck) and unknown entry types.
//   - Room: before each entry the layer filesystem must have a free inode
//     and room for the entry's declared size while keeping
//     importReservePercent of it free (errdefs.ErrResourceExhausted).
//   - Overlay whiteouts: a char device 0:0 entry stays a whiteout; the
//     OCI/AUFS forms ".wh.NAME" and ".wh..wh..opq" are converted to a
//     whiteout and to user.overlay.opaque=y.
//   - Safety: the rules of package untar, which extracts the archive:
//     entry names are relative to the layer root; absolute names and names
//     with ".." are refused, as are entries whose parent path crosses a
//     symlink: every parent is resolved with openat2 RESOLVE_BENEATH |
//     RESOLVE_NO_SYMLINKS below the layer root, so nothing is ever written
//     outside the layer or through a link.
//
// Any refused entry fails the whole import; nothing becomes visible.
func (s *Store) ImportTar(ctx context.Context, r io.Reader, opts CreateOptions) (Layer, error) {
	holder, err := s.TempDir("tar-")
	if err != nil {
		return Layer{}, err
	}
	defer os.RemoveAll(holder)
	dir := path.Join(holder, "l")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return Layer{}, err
	}
	if err := os.Lchown(dir, int(s.ids.HostID), int(s.ids.HostID)); err != nil {
		return Layer{}, err
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Layer{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	err = untar.Extract(ctx, fd, r, untar.Options{
		HardLinks:      untar.Create,
		FIFOs:          untar.Skip,
		Devices:        untar.Skip,
		Perm:           0o7777,
		Owner:          s.hostIDs,
		Xattrs:         true,
		Whiteouts:      true,
		SetRoot:        true,
		ReservePercent: importReservePercent,
		Log:            s.log,
	})
	unix.Close(fd)
	if err != nil {
		return Layer{}, fmt.Errorf("importing tar: %w", err)
	}
	return s.commit(ctx, dir, opts)
}

// importReservePercent of the layer filesystem stays free during an
// import: an archive that needs more is refused before it fills the
// daemon's disk.
const importReservePercent = 5

// hostIDs maps a tar entry's owner into the store's id range.
func (s *Store) hostIDs(uid, gid int) (int, int, error) {
	size := int64(s.ids.Size)
	if uid < 0 || int64(uid) >= size || gid < 0 || int64(gid) >= size {
		return 0, 0, fmt.Errorf("owner %d:%d outside the sandbox id map (size %d): %w", uid, gid, size, errdefs.ErrInvalidArgument)
	}
	return int(s.ids.HostID) + uid, int(s.ids.HostID) + gid, nil
}
