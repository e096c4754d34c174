package guest

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
	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/tarcheck"
)

// Extraction rules, one per tar entry type (anything not listed is refused
// with ErrInvalidArgument, so an archive is never silently half-applied):
//
//   - regular ('0', '\x00', '7' contiguous): written to a temporary name
//     beside the target and renamed over it, after checking that the
//     filesystem has room for its declared size and a free inode
//     (ErrResourceExhausted otherwise, and on ENOSPC/EDQUOT while writing);
//     the temporary file is removed on any failure, so no partial file is
//     ever left behind. It replaces a planted symlink, never writing
//     through it.
//   - directory ('5'), symlink ('2'), FIFO ('6'): created in place.
//   - hard link ('1'): only to an entry inside the target directory.
//   - PAX extended ('x') and GNU long name/link ('L', 'K') headers are
//     applied to the next entry by archive/tar; PAX global headers ('g')
//     carry no file and are ignored.
//   - char/block devices ('3', '4'): refused; a sandbox gets its devices
//     from the runtime, not from uploads.
//   - sparse files (old-GNU 'S', PAX GNU.sparse.* 0.0/0.1/1.0): refused
//     (see package tarcheck: extracting would write every hole as data).
//   - anything else (GNU dumpdir 'D', multi-volume 'M', volume 'V', ...):
//     refused.
//
// Every name is relative and cleaned, no entry is created through a
// symlink or outside the target directory (see openParent).

// extractTar extracts the tar stream r below the directory rootFd. On
// error, entries extracted before the failing one stay; the failing
// entry leaves nothing.
func extractTar(rootFd int, r io.Reader, chown bool) error {
	if err := checkFS(rootFd, "target directory"); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	var dirs []dirTime
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
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		rel, err := tarEntryPath(hdr.Name)
		if err != nil {
			return err
		}
		if err := checkEntryType(rel, hdr); err != nil {
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
	return nil
}

// checkEntryType applies the per-type rules above that need no filesystem.
func checkEntryType(rel string, hdr *tar.Header) error {
	refuse := func(why string) error {
		return fmt.Errorf("tar entry %q: %s: %w", rel, why, errdefs.ErrInvalidArgument)
	}
	if tarcheck.Sparse(hdr) {
		return tarcheck.ErrSparse(rel)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return refuse("device files are not extracted")
	}
	return refuse(fmt.Sprintf("entry type %q is not supported", hdr.Typeflag))
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

// entryKind reports what sits at base in pfd (0 when nothing), without
// following a symlink.
func entryKind(pfd int, base string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, err
	}
	return st.Mode & unix.S_IFMT, nil
}

type dirTime struct {
	rel   string
	mtime time.Time
}

// writeArchive extracts a tar stream from Data frames under req.Path
// (created if missing) by the rules of extractTar.
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
	if err := extractTar(rootFd, dr, os.Geteuid() == 0); err != nil {
		return fmt.Errorf("extracting into %s: %w", root, err)
	}
	if _, err := io.Copy(io.Discard, dr); err != nil { // trailing padding
		return err
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
	existing, err := entryKind(pfd, base)
	if err != nil {
		return wrap(err)
	}
	if existing == unix.S_IFDIR && hdr.Typeflag != tar.TypeDir {
		return wrap(fmt.Errorf("a directory is in the way: %w", errdefs.ErrAlreadyExists))
	}
	size := int64(0)
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeCont {
		size = hdr.Size
	}
	if err := checkFS(pfd, rel); err != nil {
		return err // a pseudo filesystem mounted below the target
	}
	if err := tarcheck.Room(pfd, rel, size, 0); err != nil {
		return err
	}
	// Everything but a regular file (renamed over it) and a directory
	// (kept) replaces what is there; a planted symlink is removed, never
	// followed.
	if existing != 0 && existing != unix.S_IFDIR && hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeCont {
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return wrap(err)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if existing != unix.S_IFDIR {
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
	case tar.TypeReg, tar.TypeCont:
		if err := extractFile(pfd, base, hdr, mode, r, chown); err != nil {
			if errdefs.IsInvalidArgument(err) {
				return err
			}
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
	default: // checkEntryType let only the types above through
		return wrap(fmt.Errorf("entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument))
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

// extractFile writes a regular file's data to a temporary name in pfd and
// renames it to base; on any failure the temporary file is removed.
func extractFile(pfd int, base string, hdr *tar.Header, mode uint32, r io.Reader, chown bool) (err error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".agentbox-tar-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
	}()
	// At most the declared size: tar.Reader ends the entry there. A
	// failed read is the archive's fault (truncated, malformed); a failed
	// write is the filesystem's (ENOSPC, EDQUOT: resource exhausted).
	if _, err := io.Copy(f, sourceReader{r}); err != nil {
		return err
	}
	if chown {
		_ = f.Chown(hdr.Uid, hdr.Gid)
	}
	if err := f.Chmod(fileMode(mode)); err != nil {
		return err
	}
	err = f.Close()
	f = nil
	if err != nil {
		return err
	}
	return unix.Renameat(pfd, tmp, pfd, base)
}

// sourceReader marks read errors of the archive as invalid arguments.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errdefs.IsInvalidArgument(err) {
		err = fmt.Errorf("reading tar entry: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return n, err
}
