package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/identity"
)

// writeIdentity writes the identity files (identity.Files) fresh into upper, creating the parent
// directories they need with the modes and owners they have in the lower
// layers (top-most first), so the merged view is unchanged but for the
// files themselves. New entries are owned by the mapped root hostRoot.
func writeIdentity(upper string, lowers []string, hostRoot int) error {
	for _, f := range identity.Files {
		rel := strings.TrimPrefix(f.Path, "/")
		dir := filepath.Dir(rel)
		parts := strings.Split(dir, "/")
		for i := range parts {
			rel := filepath.Join(parts[:i+1]...)
			if err := mkdirLike(filepath.Join(upper, rel), rel, lowers, hostRoot); err != nil {
				return err
			}
		}
		target := filepath.Join(upper, rel)
		if err := os.WriteFile(target, f.New(), 0o600); err != nil {
			return err
		}
		if err := os.Lchown(target, hostRoot, hostRoot); err != nil {
			return err
		}
		if err := os.Chmod(target, f.Mode); err != nil {
			return err
		}
	}
	return nil
}

// mkdirLike creates dir (in the upper layer) like the directory rel of the
// top-most lower layer that has it; 0755 root when none has.
func mkdirLike(dir, rel string, lowers []string, hostRoot int) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	mode, uid, gid := uint32(0o755), hostRoot, hostRoot
	for _, l := range lowers {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(l, rel), &st)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "lstat", Path: filepath.Join(l, rel), Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
		}
		break // a whiteout or a non-directory hides the layers below
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(dir, mode)
}
