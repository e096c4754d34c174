package guest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// readArchive sends the directory req.Path as a tar stream in Data frames.
// Entries are relative to the directory; symlinks are stored, not followed.
func (s *server) readArchive(c *conn, req *proto.Request) error {
	root, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("archiving %s: %w", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", root, errdefs.ErrInvalidArgument)
	}
	tw := tar.NewWriter(dataWriter{c})
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		} else if err != nil {
			return err
		}
		return addTarEntry(tw, p, filepath.ToSlash(rel), fi)
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := c.frame(proto.FrameEOF, nil); err != nil {
		return err
	}
	return c.bw.Flush()
}

func addTarEntry(tw *tar.Writer, p, name string, fi fs.FileInfo) error {
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(unixMode(fi.Mode())),
		ModTime: fi.ModTime(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		defer f.Close()
		// Size is taken from the open file so the header and the data agree
		// unless the file changes while being read.
		ofi, err := f.Stat()
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, ofi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		return nil
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case fi.Mode()&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil // sockets and devices are not archived
	}
	return tw.WriteHeader(hdr)
}

// tarEntryPath validates a tar entry name and returns it cleaned and
// relative; "" is the target directory itself.
func tarEntryPath(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 || len(name) > proto.MaxPathLen {
		return "", fmt.Errorf("tar entry name %q is invalid: %w", name, errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("tar entry %q has an absolute path: %w", name, errdefs.ErrInvalidArgument)
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("tar entry %q escapes the target directory: %w", name, errdefs.ErrInvalidArgument)
	}
	return clean, nil
}

// openParent opens the directory holding rel below rootFd, creating missing
// directories, without following any symlink. The caller closes the
// returned descriptor unless it is rootFd.
func openParent(rootFd int, rel string) (int, string, error) {
	dir, base := path.Split(rel)
	cur := rootFd
	for _, comp := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
		if comp == "" {
			continue
		}
		fd, err := unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, comp, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				fd, err = unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		if cur != rootFd {
			unix.Close(cur)
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, "", fmt.Errorf("tar entry %q passes through a symlink or non-directory: %w", rel, errdefs.ErrInvalidArgument)
		}
		if err != nil {
			return -1, "", fmt.Errorf("opening parent of %q: %w", rel, err)
		}
		cur = fd
	}
	return cur, base, nil
}

// clearEntry removes whatever non-directory sits at base (a planted symlink
// is removed, never followed) and reports whether a directory is there.
func clearEntry(pfd int, base string) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	return false, unix.Unlinkat(pfd, base, 0)
}

type dirTime struct {
	rel   string
	mtime time.Time
}

// writeArchive extracts a tar stream from Data frames under req.Path
// (created if missing), like a careful tar extractor: no absolute or
// escaping names, and no entry is ever created through a symlink.
func (s *server) writeArchive(c *conn, req *proto.Request) error {
	root, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", root, err)
	}
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", root, err)
	}
	defer unix.Close(rootFd)
	dr := &dataReader{c: c}
	tr := tar.NewReader(dr)
	var dirs []dirTime
	chown := os.Geteuid() == 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errdefs.IsInvalidArgument(err) {
				return err
			}
			return fmt.Errorf("reading tar stream: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		rel, err := tarEntryPath(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue
		}
		if err := extractEntry(rootFd, rel, hdr, tr, chown); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{rel, hdr.ModTime})
		}
	}
	if _, err := io.Copy(io.Discard, dr); err != nil { // trailing padding
		return err
	}
	// Directory times last: creating their entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		pfd, base, err := openParent(rootFd, dirs[i].rel)
		if err != nil {
			continue
		}
		ts := []unix.Timespec{unix.NsecToTimespec(dirs[i].mtime.UnixNano()), unix.NsecToTimespec(dirs[i].mtime.UnixNano())}
		_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		if pfd != rootFd {
			unix.Close(pfd)
		}
	}
	return c.reply(nil)
}

func extractEntry(rootFd int, rel string, hdr *tar.Header, r io.Reader, chown bool) error {
	pfd, base, err := openParent(rootFd, rel)
	if err != nil {
		return err
	}
	if pfd != rootFd {
		defer unix.Close(pfd)
	}
	mode := uint32(hdr.Mode) & 0o7777
	wrap := func(err error) error { return fmt.Errorf("extracting %q: %w", rel, err) }
	isDir, err := clearEntry(pfd, base)
	if err != nil {
		return wrap(err)
	}
	if isDir && hdr.Typeflag != tar.TypeDir {
		return wrap(fmt.Errorf("a directory is in the way: %w", errdefs.ErrAlreadyExists))
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return wrap(err)
			}
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return wrap(err)
		}
		defer unix.Close(fd)
		if chown {
			_ = unix.Fchown(fd, hdr.Uid, hdr.Gid)
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return wrap(err)
		}
		return nil
	case tar.TypeReg:
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return wrap(err)
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			if errdefs.IsInvalidArgument(err) {
				return err
			}
			return wrap(err)
		}
		if chown {
			_ = f.Chown(hdr.Uid, hdr.Gid)
		}
		if err := f.Chmod(fileMode(mode)); err != nil {
			return wrap(err)
		}
	case tar.TypeSymlink:
		if strings.IndexByte(hdr.Linkname, 0) >= 0 || hdr.Linkname == "" {
			return wrap(fmt.Errorf("invalid symlink target: %w", errdefs.ErrInvalidArgument))
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return wrap(err)
		}
		if chown {
			_ = unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
		}
	case tar.TypeLink:
		target, err := tarEntryPath(hdr.Linkname)
		if err != nil || target == "" {
			return wrap(fmt.Errorf("hard link target %q: %w", hdr.Linkname, errdefs.ErrInvalidArgument))
		}
		tfd, tbase, err := openParent(rootFd, target)
		if err != nil {
			return err
		}
		err = unix.Linkat(tfd, tbase, pfd, base, 0)
		if tfd != rootFd {
			unix.Close(tfd)
		}
		if err != nil {
			return wrap(err)
		}
		return nil
	case tar.TypeFifo:
		if err := unix.Mkfifoat(pfd, base, mode); err != nil {
			return wrap(err)
		}
	default:
		return nil // devices and other special entries are skipped
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}
