package inproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
)

// copyUp gives the guest the merged view of spec's layers without an
// overlay: every directory, file and symlink visible through
// Layers+UpperDir that UpperDir lacks is copied into UpperDir, as if
// overlayfs had copied it up. The view the sandbox sees is unchanged by it
// (so are diffs and tree hashes); checkpoints of the upper dir grow by the
// copies. Copies keep their owner when the caller is root. Devices, fifos
// and sockets are not copied (no root), and a file
// of the layers that the sandbox deleted comes back at its next start (no
// whiteouts are written).
func copyUp(ctx context.Context, spec runtime.Spec) error {
	v, err := layers.MergedView(ctx, append([]string{spec.UpperDir}, spec.Layers...), runtime.IDMap{})
	if err != nil {
		return fmt.Errorf("merging layers: %w", err)
	}
	for _, p := range v.Paths() {
		if p == "/" {
			continue
		}
		dst := filepath.Join(spec.UpperDir, p)
		if _, err := os.Lstat(dst); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		e := v.Get(p)
		if err := copyEntry(e, dst); err != nil {
			return fmt.Errorf("copying up %s: %w", p, err)
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(dst, int(e.UID), int(e.GID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("copying up %s: %w", p, err)
			}
		}
	}
	return nil
}

func copyEntry(e *layers.Entry, dst string) error {
	mode := fs.FileMode(e.Mode & 0o777)
	switch e.Type {
	case layers.TypeDir:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		return os.Chmod(dst, mode)
	case layers.TypeSymlink:
		return os.Symlink(e.Target, dst)
	case layers.TypeFile:
		src, err := layers.OpenEntry(e)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		if err := out.Chmod(mode); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	return nil // devices, fifos, sockets: see copyUp
}

// owner is the host uid and gid the sandbox's root has on disk: the layer
// owner (Spec.LayerIDs, else UIDMap/GIDMap).
func owner(spec runtime.Spec) (int, int) {
	if spec.LayerIDs.Size > 0 {
		return int(spec.LayerIDs.HostID), int(spec.LayerIDs.HostID)
	}
	return int(spec.UIDMap.HostID), int(spec.GIDMap.HostID)
}

// giveToSandbox hands what the guest (running as this process) created
// in spec's UpperDir to the sandbox's root, as a user namespace would
// have stored it: when this process is root, every entry owned by root
// is chowned to owner(spec). Otherwise, or when the sandbox's root is
// host root, it does nothing.
func giveToSandbox(spec runtime.Spec) {
	uid, gid := owner(spec)
	if os.Geteuid() != 0 || uid == 0 || spec.UpperDir == "" {
		return
	}
	_ = filepath.WalkDir(spec.UpperDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
			_ = os.Lchown(p, uid, gid)
		}
		return nil
	})
}
