package layers

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tarcheck"
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
//   - Safety: entry names are relative to the layer root; absolute names and
//     names with ".." are refused, as are entries whose parent path crosses a
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
	x, err := newExtractor(dir, s)
	if err != nil {
		return Layer{}, err
	}
	defer x.close()
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return Layer{}, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Layer{}, fmt.Errorf("importing tar: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return Layer{}, fmt.Errorf("importing tar entry %q: %w", hdr.Name, err)
		}
	}
	if err := x.finish(); err != nil {
		return Layer{}, fmt.Errorf("importing tar: %w", err)
	}
	x.close()
	return s.commit(ctx, dir, opts)
}

// importReservePercent of the layer filesystem stays free during an
// import: an archive that needs more is refused before it fills the
// daemon's disk.
const importReservePercent = 5

// extractor writes tar entries below one root directory fd.
type extractor struct {
	rootFD int
	s      *Store
	dirs   []dirMtime // applied last, deepest first
}

type dirMtime struct {
	rel string
	t   time.Time
}

func newExtractor(dir string, s *Store) (*extractor, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &extractor{rootFD: fd, s: s}, nil
}

func (x *extractor) close() {
	if x.rootFD >= 0 {
		unix.Close(x.rootFD)
		x.rootFD = -1
	}
}

// cleanName validates a tar entry name and returns it relative to the layer
// root ("." for the root itself).
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute path: %w", errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path escapes the layer: %w", errdefs.ErrInvalidArgument)
		}
	}
	return path.Clean(name), nil
}

// openDir opens the directory rel (relative to the root) without following
// any symlink and without leaving the root. Missing directories are created
// (0755, mapped root) when create is set.
func (x *extractor) openDir(rel string, create bool) (int, error) {
	fd, err := unix.Openat2(x.rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("parent %q is not a directory inside the layer: %w", rel, errdefs.ErrInvalidArgument)
	}
	if !errors.Is(err, unix.ENOENT) || !create || rel == "." {
		return -1, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	parent, err := x.openDir(path.Dir(rel), true)
	if err != nil {
		return -1, err
	}
	defer unix.Close(parent)
	base := path.Base(rel)
	if err := unix.Mkdirat(parent, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, &os.PathError{Op: "mkdirat", Path: rel, Err: err}
	}
	if err := unix.Fchownat(parent, base, int(x.s.ids.HostID), int(x.s.ids.HostID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, &os.PathError{Op: "fchownat", Path: rel, Err: err}
	}
	return x.openDir(rel, false)
}

func (x *extractor) hostIDs(hdr *tar.Header) (int, int, error) {
	size := int64(x.s.ids.Size)
	if hdr.Uid < 0 || int64(hdr.Uid) >= size || hdr.Gid < 0 || int64(hdr.Gid) >= size {
		return 0, 0, fmt.Errorf("owner %d:%d outside the sandbox id map (size %d): %w", hdr.Uid, hdr.Gid, size, errdefs.ErrInvalidArgument)
	}
	return int(x.s.ids.HostID) + hdr.Uid, int(x.s.ids.HostID) + hdr.Gid, nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	uid, gid, err := x.hostIDs(hdr)
	if err != nil {
		return err
	}
	if tarcheck.Sparse(hdr) {
		return tarcheck.ErrSparse(hdr.Name)
	}
	perm := uint32(hdr.Mode) & 0o7777
	typ := hdr.Typeflag
	switch typ {
	case tar.TypeXGlobalHeader:
		return nil // archive-wide metadata, no file
	case tar.TypeReg, tar.TypeCont, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	default:
		return fmt.Errorf("entry type %q is not supported: %w", typ, errdefs.ErrInvalidArgument)
	}

	base := path.Base(rel)
	// OCI/AUFS whiteouts.
	if base == ".wh..wh..opq" {
		fd, err := x.openDir(path.Dir(rel), true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return x.setOpaque(path.Dir(rel))
	}
	if name, ok := strings.CutPrefix(base, ".wh."); ok && typ != tar.TypeDir {
		rel, base, typ, perm = path.Join(path.Dir(rel), name), name, tar.TypeChar, 0
		hdr = &tar.Header{Typeflag: tar.TypeChar, ModTime: hdr.ModTime, Uid: hdr.Uid, Gid: hdr.Gid}
	}

	if rel == "." {
		if typ != tar.TypeDir {
			return fmt.Errorf("the root must be a directory: %w", errdefs.ErrInvalidArgument)
		}
		return x.setMeta(".", uid, gid, perm, hdr, true)
	}
	parent, err := x.openDir(path.Dir(rel), true)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	// Before writing: room for the entry, keeping a reserve so an import
	// never fills the daemon's filesystem.
	size := int64(0)
	if typ == tar.TypeReg || typ == tar.TypeCont {
		size = hdr.Size
	}
	if err := tarcheck.Room(parent, rel, size, importReservePercent); err != nil {
		return err
	}

	switch typ {
	case tar.TypeDir:
		err := unix.Mkdirat(parent, base, 0o700)
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := unix.Unlinkat(parent, base, 0); err != nil {
					return &os.PathError{Op: "unlinkat", Path: rel, Err: err}
				}
				err = unix.Mkdirat(parent, base, 0o700)
			} else {
				err = nil
			}
		}
		if err != nil {
			return &os.PathError{Op: "mkdirat", Path: rel, Err: err}
		}
		return x.setMeta(rel, uid, gid, perm, hdr, true)
	case tar.TypeReg, tar.TypeCont: // archive/tar reports old TypeRegA entries as TypeReg
		if err := x.replace(parent, rel, base); err != nil {
			return err
		}
		fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return &os.PathError{Op: "openat", Path: rel, Err: err}
		}
		f := os.NewFile(uintptr(fd), rel)
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", rel, err)
		}
		return x.setMeta(rel, uid, gid, perm, hdr, false)
	case tar.TypeSymlink:
		if err := x.replace(parent, rel, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
			return &os.PathError{Op: "symlinkat", Path: rel, Err: err}
		}
		if err := unix.Fchownat(parent, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "fchownat", Path: rel, Err: err}
		}
		return setTime(parent, base, hdr.ModTime)
	case tar.TypeLink:
		oldRel, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
		oldParent, err := x.openDir(path.Dir(oldRel), false)
		if err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
		defer unix.Close(oldParent)
		if err := x.replace(parent, rel, base); err != nil {
			return err
		}
		// Flags 0: a symlink target is linked itself, never followed.
		if err := unix.Linkat(oldParent, path.Base(oldRel), parent, base, 0); err != nil {
			return &os.PathError{Op: "linkat", Path: rel, Err: err}
		}
		return nil
	case tar.TypeChar:
		if hdr.Devmajor != 0 || hdr.Devminor != 0 {
			return nil // a real device: the sandbox gets its /dev at run time
		}
		if err := x.replace(parent, rel, base); err != nil {
			return err
		}
		if err := unix.Mknodat(parent, base, unix.S_IFCHR, 0); err != nil {
			return &os.PathError{Op: "mknodat", Path: rel, Err: err}
		}
		if err := unix.Fchownat(parent, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "fchownat", Path: rel, Err: err}
		}
		if err := unix.Fchmodat(parent, base, perm, 0); err != nil {
			return &os.PathError{Op: "fchmodat", Path: rel, Err: err}
		}
		return setTime(parent, base, hdr.ModTime)
	default: // block devices and fifos (unknown types were refused above)
		x.s.log.Debug("skipping tar entry", "name", hdr.Name, "type", string(typ))
		return nil
	}
}

// replace removes whatever is at parent/base (tar semantics: a later entry
// wins). A non-empty directory is not replaced.
func (x *extractor) replace(parent int, rel, base string) error {
	err := unix.Unlinkat(parent, base, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(parent, base, unix.AT_REMOVEDIR)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlinkat", Path: rel, Err: err}
	}
	return nil
}

// setMeta sets owner, mode, xattrs and (for non-directories) the mtime of
// the file or directory rel, through an fd opened without following links.
func (x *extractor) setMeta(rel string, uid, gid int, perm uint32, hdr *tar.Header, isDir bool) error {
	flags := uint64(unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC)
	if isDir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat2(x.rootFD, rel, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return &os.PathError{Op: "fchown", Path: rel, Err: err}
	}
	// After chown, which clears setuid/setgid.
	if err := unix.Fchmod(fd, perm); err != nil {
		return &os.PathError{Op: "fchmod", Path: rel, Err: err}
	}
	for key, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(key, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if name == "trusted.overlay.opaque" {
			name = xattrOpaque
		}
		// Only user.* xattrs are content a sandbox can see and set itself;
		// security.capability cannot be honoured under a userns mapping
		// (see ImportTar), the rest carries host-level meaning.
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			return &os.PathError{Op: "fsetxattr " + name, Path: rel, Err: err}
		}
	}
	if isDir {
		x.dirs = append(x.dirs, dirMtime{rel, hdr.ModTime})
		return nil
	}
	return x.setTimeRel(rel, hdr.ModTime)
}

func (x *extractor) setOpaque(rel string) error {
	fd, err := unix.Openat2(x.rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsetxattr(fd, xattrOpaque, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "fsetxattr", Path: rel, Err: err}
	}
	return nil
}

func setTime(dirfd int, name string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.UtimesNanoAt(dirfd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
}

// finish applies directory mtimes, deepest (last extracted) first, once no
// more entries can touch them.
func (x *extractor) finish() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.setTimeRel(x.dirs[i].rel, x.dirs[i].t); err != nil {
			return err
		}
	}
	return nil
}

// setTimeRel sets the times of rel (never following a final symlink).
func (x *extractor) setTimeRel(rel string, t time.Time) error {
	if rel == "." {
		return setTime(x.rootFD, ".", t)
	}
	parent, err := x.openDir(path.Dir(rel), false)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	return setTime(parent, path.Base(rel), t)
}
