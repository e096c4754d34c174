package untar

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
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

// extractor writes the entries of one archive beneath one root.
type extractor struct {
	root int
	opts Options
	dirs []dirTime // directory times, applied last in reverse order
}

// resolve are the openat2 rules of every lookup below the root.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openDir opens the directory rel beneath the root without following any
// symlink. Missing directories are created when create is set.
func (x *extractor) openDir(rel string, create bool) (int, error) {
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolve,
	})
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("%q passes through a symlink or non-directory: %w", rel, errdefs.ErrInvalidArgument)
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
	if err := unix.Mkdirat(parent, base, x.dirPerm()); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, &os.PathError{Op: "mkdirat", Path: rel, Err: err}
	} else if err == nil && x.opts.Owner != nil {
		uid, gid, err := x.opts.Owner(0, 0)
		if err == nil {
			err = unix.Fchownat(parent, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil && !x.opts.OwnerBestEffort {
			return -1, &os.PathError{Op: "fchownat", Path: rel, Err: err}
		}
	}
	return x.openDir(rel, false)
}

// dirPerm is the mode of directories created as parents.
func (x *extractor) dirPerm() uint32 {
	if x.opts.Perm == 0 {
		return 0o700
	}
	return 0o755 &^ x.opts.Umask
}

// mode is the mode an entry of type typ and archive mode hdrMode gets
// (Options.Perm, OwnerWritableDirs, Umask); only used when Perm is set.
func (o *Options) mode(typ byte, hdrMode int64) uint32 {
	perm := uint32(hdrMode) & o.Perm
	if typ == tar.TypeDir && o.OwnerWritableDirs {
		perm |= 0o700
	}
	return perm &^ o.Umask
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	action, err := x.opts.typeAction(hdr)
	if err != nil {
		return err
	}
	rel, err := CleanName(hdr.Name)
	if err != nil {
		return err
	}
	uid, gid := -1, -1
	if x.opts.Owner != nil {
		if uid, gid, err = x.opts.Owner(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	typ, perm := hdr.Typeflag, x.opts.mode(hdr.Typeflag, hdr.Mode)
	if x.opts.Whiteouts && rel != "." {
		base := path.Base(rel)
		if base == ".wh..wh..opq" {
			return x.setOpaque(path.Dir(rel))
		}
		if name, ok := strings.CutPrefix(base, ".wh."); ok && typ != tar.TypeDir {
			rel, typ, perm, action = path.Join(path.Dir(rel), name), tar.TypeChar, 0, Create
			hdr = &tar.Header{Typeflag: tar.TypeChar, ModTime: hdr.ModTime, Uid: hdr.Uid, Gid: hdr.Gid}
		}
	}
	if action == Skip {
		if x.opts.Log != nil {
			x.opts.Log.Debug("skipping tar entry", "name", hdr.Name, "type", string(typ))
		}
		return nil
	}
	if rel == "." {
		if !x.opts.SetRoot {
			return nil
		}
		if typ != tar.TypeDir {
			return fmt.Errorf("the root must be a directory: %w", errdefs.ErrInvalidArgument)
		}
		return x.setMeta(x.root, ".", uid, gid, perm, hdr, true)
	}
	parent, err := x.openDir(path.Dir(rel), true)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	if x.opts.CheckDir != nil {
		if err := x.opts.CheckDir(parent, rel); err != nil {
			return err
		}
	}
	size := int64(0)
	if typ == tar.TypeReg || typ == tar.TypeCont {
		size = hdr.Size
	}
	if err := tarcheck.Room(parent, rel, size, x.opts.ReservePercent); err != nil {
		return err
	}
	base := path.Base(rel)
	existing, err := entryKind(parent, base)
	if err != nil {
		return &os.PathError{Op: "fstatat", Path: rel, Err: err}
	}
	if existing == unix.S_IFDIR && typ != tar.TypeDir {
		return fmt.Errorf("a directory is in the way: %w", errdefs.ErrAlreadyExists)
	}
	// A regular file is renamed over what is there; everything else but
	// a directory kept for a directory replaces it. A planted symlink is
	// removed, never followed.
	if existing != 0 && existing != unix.S_IFDIR && typ != tar.TypeReg && typ != tar.TypeCont {
		if err := unix.Unlinkat(parent, base, 0); err != nil {
			return &os.PathError{Op: "unlinkat", Path: rel, Err: err}
		}
	}

	switch typ {
	case tar.TypeDir:
		if existing != unix.S_IFDIR {
			if err := unix.Mkdirat(parent, base, 0o700); err != nil {
				return &os.PathError{Op: "mkdirat", Path: rel, Err: err}
			}
		}
		fd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "openat", Path: rel, Err: err}
		}
		defer unix.Close(fd)
		return x.setMeta(fd, rel, uid, gid, perm, hdr, true)
	case tar.TypeReg, tar.TypeCont: // archive/tar reports old TypeRegA entries as TypeReg
		return x.writeFile(parent, rel, base, uid, gid, perm, hdr, r)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return fmt.Errorf("invalid symlink target: %w", errdefs.ErrInvalidArgument)
		}
		if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
			return &os.PathError{Op: "symlinkat", Path: rel, Err: err}
		}
		if err := x.chownAt(parent, base, rel, uid, gid); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := CleanName(hdr.Linkname)
		if err == nil && target == "." {
			err = fmt.Errorf("the root: %w", errdefs.ErrInvalidArgument)
		}
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", clip(hdr.Linkname), err)
		}
		tparent, err := x.openDir(path.Dir(target), false)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", clip(hdr.Linkname), err)
		}
		defer unix.Close(tparent)
		// Flags 0: a symlink target is linked itself, never followed.
		if err := unix.Linkat(tparent, path.Base(target), parent, base, 0); err != nil {
			return &os.PathError{Op: "linkat", Path: rel, Err: err}
		}
		return nil // the target's owner, mode and time are the link's
	case tar.TypeChar: // an overlay whiteout (typeAction refused devices)
		if err := unix.Mknodat(parent, base, unix.S_IFCHR, 0); err != nil {
			return &os.PathError{Op: "mknodat", Path: rel, Err: err}
		}
		if err := x.chmodAt(parent, base, rel, uid, gid, perm); err != nil {
			return err
		}
	case tar.TypeFifo:
		if err := unix.Mkfifoat(parent, base, 0o600); err != nil {
			return &os.PathError{Op: "mkfifoat", Path: rel, Err: err}
		}
		if err := x.chmodAt(parent, base, rel, uid, gid, perm); err != nil {
			return err
		}
	default: // typeAction let only the types above through
		return fmt.Errorf("entry type %q: %w", typ, errdefs.ErrInvalidArgument)
	}
	setTime(parent, base, hdr.ModTime)
	return nil
}

// entryKind reports what sits at base in parent (0 when nothing), without
// following a symlink.
func entryKind(parent int, base string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, err
	}
	return st.Mode & unix.S_IFMT, nil
}

// chownAt gives parent/base (never following a symlink) its owner when
// Options.Owner is set.
func (x *extractor) chownAt(parent int, base, rel string, uid, gid int) error {
	if x.opts.Owner == nil {
		return nil
	}
	if err := unix.Fchownat(parent, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !x.opts.OwnerBestEffort {
		return &os.PathError{Op: "fchownat", Path: rel, Err: err}
	}
	return nil
}

// chmodAt sets the owner, then the mode of parent/base, a node that is
// neither a directory nor a symlink nor a regular file.
func (x *extractor) chmodAt(parent int, base, rel string, uid, gid int, perm uint32) error {
	if err := x.chownAt(parent, base, rel, uid, gid); err != nil {
		return err
	}
	if x.opts.Perm == 0 {
		return nil
	}
	if err := unix.Fchmodat(parent, base, perm, 0); err != nil {
		return &os.PathError{Op: "fchmodat", Path: rel, Err: err}
	}
	return nil
}

// writeFile writes a regular file's data to a temporary name in parent
// and renames it to base; on any failure the temporary file is removed.
func (x *extractor) writeFile(parent int, rel, base string, uid, gid int, perm uint32, hdr *tar.Header, r io.Reader) (err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".agentbox-tar-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(parent, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "openat", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), rel)
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			_ = unix.Unlinkat(parent, tmp, 0)
		}
	}()
	// At most the declared size: tar.Reader ends the entry there. A
	// failed read is the archive's fault (truncated, malformed); a failed
	// write is the filesystem's (ENOSPC, EDQUOT).
	if _, err := io.Copy(f, sourceReader{r}); err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	if err := x.setMeta(fd, rel, uid, gid, perm, hdr, false); err != nil {
		return err
	}
	err = f.Close()
	f = nil
	if err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	if err := unix.Renameat(parent, tmp, parent, base); err != nil {
		return &os.PathError{Op: "renameat", Path: rel, Err: err}
	}
	setTime(parent, base, hdr.ModTime)
	return nil
}

// setMeta sets the owner, mode and xattrs of the open file or directory
// fd (rel beneath the root) and, for a directory, queues its time.
func (x *extractor) setMeta(fd int, rel string, uid, gid int, perm uint32, hdr *tar.Header, isDir bool) error {
	if isDir && rel == "." {
		// The root's descriptor may be O_PATH: reopen it for fchown
		// and fsetxattr.
		rfd, err := unix.Openat(x.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "openat", Path: rel, Err: err}
		}
		defer unix.Close(rfd)
		fd = rfd
	}
	if x.opts.Owner != nil {
		if err := unix.Fchown(fd, uid, gid); err != nil && !x.opts.OwnerBestEffort {
			return &os.PathError{Op: "fchown", Path: rel, Err: err}
		}
	}
	// After chown, which clears setuid/setgid.
	if x.opts.Perm != 0 {
		if err := unix.Fchmod(fd, perm); err != nil {
			return &os.PathError{Op: "fchmod", Path: rel, Err: err}
		}
	}
	if x.opts.Xattrs {
		for key, v := range hdr.PAXRecords {
			name, ok := strings.CutPrefix(key, "SCHILY.xattr.")
			if !ok {
				continue
			}
			if name == "trusted.overlay.opaque" && x.opts.Whiteouts {
				name = OpaqueXattr
			}
			// Only user.* xattrs are content a sandbox can see and set
			// itself; security.capability cannot be honoured under a
			// user namespace mapping, the rest carries host-level meaning.
			if !strings.HasPrefix(name, "user.") {
				continue
			}
			if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
				return &os.PathError{Op: "fsetxattr " + name, Path: rel, Err: err}
			}
		}
	}
	if isDir {
		x.dirs = append(x.dirs, dirTime{rel, hdr.ModTime})
	}
	return nil
}

// setOpaque marks the directory rel (created if missing) opaque.
func (x *extractor) setOpaque(rel string) error {
	if rel != "." {
		fd, err := x.openDir(rel, true)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolve,
	})
	if err != nil {
		return &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsetxattr(fd, OpaqueXattr, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "fsetxattr", Path: rel, Err: err}
	}
	return nil
}

// setTime sets the times of dirfd/name, never following a symlink. A
// failure is ignored: times are kept as far as the filesystem allows.
func setTime(dirfd int, name string, t time.Time) {
	ts := unix.NsecToTimespec(t.UnixNano())
	_ = unix.UtimesNanoAt(dirfd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// finish applies directory times, deepest (last extracted) first, once no
// more entries can touch them.
func (x *extractor) finish() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		rel := x.dirs[i].rel
		if rel == "." {
			setTime(x.root, ".", x.dirs[i].t)
			continue
		}
		parent, err := x.openDir(path.Dir(rel), false)
		if err != nil {
			continue
		}
		setTime(parent, path.Base(rel), x.dirs[i].t)
		unix.Close(parent)
	}
}

// sourceReader marks read errors of the archive as invalid arguments.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errdefs.IsInvalidArgument(err) {
		err = fmt.Errorf("reading tar entry: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	return n, err
}
