package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/untar"
)

// TreeHash returns the content hash of the directory tree at dir: a sha256
// over a deterministic walk (lexical order) that records, for every entry
// including dir itself, its path, type, permission bits (with setuid, setgid
// and sticky), owner and group as ids inside the sandbox (host id minus
// ids.HostID), and then per type: the content hash of a regular file (or the
// earlier path of the same inode for hardlinks), a symlink's target, a
// device's number; whiteouts (char 0:0) and opaque directories
// (user.overlay.opaque or trusted.overlay.opaque = "y") get explicit markers,
// and other xattrs outside the overlay namespace are included by name and
// value. Modification times are excluded, as are overlay bookkeeping xattrs
// (origin, impure, ...) which are not content.
//
// A file owned by a host id outside ids fails with
// errdefs.ErrInvalidArgument. With a zero ids (Size 0) host ids are hashed
// as they are.
//
// Two trees with the same TreeHash are byte-identical as seen from inside a
// sandbox, which later proves restores exact.
func TreeHash(dir string, ids idrange.IDMap) (string, error) {
	h, _, err := hashTree(context.Background(), dir, ids)
	return h, err
}

// hashTree computes TreeHash and the bytes allocated by the tree.
func hashTree(ctx context.Context, dir string, ids idrange.IDMap) (string, int64, error) {
	h := sha256.New()
	var size int64
	inodes := map[uint64]string{} // inode -> first path, for hardlinks
	walkErr := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		uid, gid := int64(st.Uid), int64(st.Gid)
		if ids.Size > 0 {
			uid, gid = uid-int64(ids.HostID), gid-int64(ids.HostID)
			if uid < 0 || gid < 0 || uid >= int64(ids.Size) || gid >= int64(ids.Size) {
				return fmt.Errorf("%s is owned by host %d:%d, outside the sandbox id map: %w", rel, st.Uid, st.Gid, errdefs.ErrInvalidArgument)
			}
		}
		perm := st.Mode & 0o7777
		fmt.Fprintf(h, "%q %o %d %d ", rel, perm, uid, gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Write([]byte("dir"))
			if opaque(path) {
				h.Write([]byte(" opaque"))
			}
		case unix.S_IFREG:
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					fmt.Fprintf(h, "hardlink %q\n", first)
					return nil
				}
				inodes[st.Ino] = rel
			}
			size += st.Blocks * 512
			if err := hashFile(h, path, st.Size); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "symlink %q", target)
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				h.Write([]byte("whiteout"))
			} else {
				fmt.Fprintf(h, "char %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
			}
		case unix.S_IFBLK:
			fmt.Fprintf(h, "block %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			h.Write([]byte("fifo"))
		case unix.S_IFSOCK:
			h.Write([]byte("socket"))
		default:
			return fmt.Errorf("%s: unknown file type %o: %w", rel, st.Mode&unix.S_IFMT, errdefs.ErrInvalidArgument)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if err := hashXattrs(h, path); err != nil {
				return err
			}
		}
		h.Write([]byte("\n"))
		return nil
	})
	if walkErr != nil {
		return "", 0, fmt.Errorf("hashing tree %s: %w", dir, walkErr)
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

func hashFile(h hash.Hash, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fh := sha256.New()
	n, err := io.Copy(fh, f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	fmt.Fprintf(h, "file %d %x", n, fh.Sum(nil))
	if n != size {
		return fmt.Errorf("%s changed while hashing: %w", path, errdefs.ErrConflict)
	}
	return nil
}

// opaque reports whether the directory carries an overlay opaque marker.
func opaque(path string) bool {
	for _, name := range []string{xattrOpaque, "trusted.overlay.opaque"} {
		if v, err := getxattr(path, name); err == nil && string(v) == "y" {
			return true
		}
	}
	return false
}

// xattrOpaque marks an opaque directory in an unprivileged overlay.
const xattrOpaque = untar.OpaqueXattr

// hashXattrs adds every xattr outside the overlay namespaces, sorted.
func hashXattrs(h hash.Hash, path string) error {
	names, err := listxattr(path)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		if strings.HasPrefix(name, "user.overlay.") || strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		v, err := getxattr(path, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, " xattr %q=%q", name, v)
	}
	return nil
}

func listxattr(path string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "llistxattr", Path: path, Err: err}
		}
		var names []string
		for _, n := range strings.Split(string(buf[:n]), "\x00") {
			if n != "" {
				names = append(names, n)
			}
		}
		return names, nil
	}
}

func getxattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "lgetxattr", Path: path, Err: err}
		}
		return buf[:n], nil
	}
}
