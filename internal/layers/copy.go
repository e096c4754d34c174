package layers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// copyOptions select between adopting a layer (preserve: an exact copy) and
// importing host files (owned by uid:gid, regular files, dirs and symlinks
// only).
type copyOptions struct {
	preserve bool // keep owners, xattrs, whiteouts, fifos and hardlinks
	reflink  bool // share file data with FICLONE where the filesystem can
	uid, gid int  // owner when !preserve
}

// copyTree copies src to dst (which must not exist). Symlinks are copied,
// never followed; dst is a fresh private directory so plain path operations
// on it are safe.
func copyTree(ctx context.Context, src, dst string, o copyOptions) error {
	type dirTime struct {
		path string
		ts   []unix.Timespec
	}
	var dirs []dirTime
	inodes := map[uint64]string{} // src inode -> dst path (preserve only)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		uid, gid := o.uid, o.gid
		if o.preserve {
			uid, gid = int(st.Uid), int(st.Gid)
		}
		perm := st.Mode & 0o7777
		ts := []unix.Timespec{st.Atim, st.Mtim}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{target, ts})
		case unix.S_IFREG:
			if o.preserve && st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					return os.Link(first, target)
				}
				inodes[st.Ino] = target
			}
			if err := copyFile(path, target, o.reflink); err != nil {
				return err
			}
		case unix.S_IFLNK:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			if err := os.Lchown(target, uid, gid); err != nil {
				return err
			}
			return unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
		case unix.S_IFCHR, unix.S_IFIFO:
			if !o.preserve {
				return nil
			}
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return &os.PathError{Op: "mknod", Path: target, Err: err}
			}
		default: // block devices and sockets are never layer content
			return nil
		}
		if err := os.Lchown(target, uid, gid); err != nil {
			return err
		}
		// After chown, which clears setuid/setgid.
		if err := unix.Chmod(target, perm); err != nil {
			return &os.PathError{Op: "chmod", Path: target, Err: err}
		}
		if o.preserve {
			if err := copyXattrs(path, target); err != nil {
				return err
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, dirs[i].path, dirs[i].ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("copying %s: %w", src, &os.PathError{Op: "utimensat", Path: dirs[i].path, Err: err})
		}
	}
	return nil
}

func copyFile(src, dst string, reflink bool) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if err := copyData(out, in, reflink); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}

func copyXattrs(src, dst string) error {
	names, err := listxattr(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		v, err := getxattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, v, 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
				continue // e.g. user.* on a device node: not representable
			}
			return &os.PathError{Op: "lsetxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}
