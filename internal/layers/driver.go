package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Driver is how the store turns directories into layer content on its
// filesystem: the checkpoint capture of a sandbox's upper directory, the
// adoption of a directory from another filesystem, and the copies made by
// Squash all go through the store's Driver.
//
// Contract:
//   - Clone makes dst (which must not exist; its parent must, on the
//     store's filesystem) an exact copy of src: owners, permission bits
//     (setuid, setgid, sticky), timestamps, xattrs (user.overlay.* ones
//     included), overlay whiteouts (character devices 0:0), fifos,
//     hardlinks inside src and symlinks (never followed). Sockets and block
//     devices are skipped. src is only read. After a later modification of
//     dst, src is unchanged and vice versa (copies never share writable
//     state). On error dst may hold a partial copy that the caller removes.
//   - Clone is safe for concurrent use with distinct dst.
//   - Clone honours ctx between files.
type Driver interface {
	// Name identifies the driver in GET /v1/info: "copy" or "reflink".
	Name() string
	// Features reports what the store's filesystem supports.
	Features() DriverFeatures
	// Clone copies the tree src to dst (see the contract above).
	Clone(ctx context.Context, src, dst string) error
}

// DriverFeatures is what a driver found its filesystem capable of.
type DriverFeatures struct {
	// Filesystem is the type of the store's filesystem ("ext4", "xfs",
	// "btrfs", "tmpfs", or "0x<magic>").
	Filesystem string `json:"filesystem"`
	// Reflink: file data is shared copy-on-write between a file and its
	// clones (FICLONE), so a clone costs metadata only.
	Reflink bool `json:"reflink"`
}

// CopyDriver copies file data byte by byte. It works on any filesystem.
type CopyDriver struct{ fs string }

// Name implements Driver.
func (CopyDriver) Name() string { return "copy" }

// Features implements Driver.
func (d CopyDriver) Features() DriverFeatures { return DriverFeatures{Filesystem: d.fs} }

// Clone implements Driver.
func (CopyDriver) Clone(ctx context.Context, src, dst string) error {
	return copyTree(ctx, src, dst, copyOptions{preserve: true})
}

// ReflinkDriver shares file data between a layer and its source with
// FICLONE (xfs with reflink=1, btrfs, bcachefs, ...): a clone of a tree
// costs one metadata operation per file, whatever the files' sizes. A file
// that cannot be cloned (another filesystem) is copied.
type ReflinkDriver struct{ fs string }

// Name implements Driver.
func (ReflinkDriver) Name() string { return "reflink" }

// Features implements Driver.
func (d ReflinkDriver) Features() DriverFeatures {
	return DriverFeatures{Filesystem: d.fs, Reflink: true}
}

// Clone implements Driver.
func (ReflinkDriver) Clone(ctx context.Context, src, dst string) error {
	return copyTree(ctx, src, dst, copyOptions{preserve: true, reflink: true})
}

var (
	_ Driver = CopyDriver{}
	_ Driver = ReflinkDriver{}
)

// ProbeDriver returns the fastest driver that works in dir, an existing
// directory on the filesystem to be probed: ReflinkDriver when a FICLONE
// between two scratch files in dir succeeds, else CopyDriver. The scratch
// files are removed.
func ProbeDriver(dir string) (Driver, error) {
	fs, err := filesystemName(dir)
	if err != nil {
		return nil, err
	}
	ok, err := probeReflink(dir)
	if err != nil {
		return nil, err
	}
	if ok {
		return ReflinkDriver{fs: fs}, nil
	}
	return CopyDriver{fs: fs}, nil
}

func filesystemName(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	switch uint32(st.Type) {
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs", nil
	case unix.XFS_SUPER_MAGIC:
		return "xfs", nil
	case unix.EXT4_SUPER_MAGIC:
		return "ext4", nil
	case unix.TMPFS_MAGIC:
		return "tmpfs", nil
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay", nil
	case unix.BCACHEFS_SUPER_MAGIC:
		return "bcachefs", nil
	}
	return fmt.Sprintf("0x%x", uint32(st.Type)), nil
}

func probeReflink(dir string) (bool, error) {
	probe, err := os.MkdirTemp(dir, "probe-")
	if err != nil {
		return false, fmt.Errorf("probing storage driver: %w", err)
	}
	defer os.RemoveAll(probe)
	src, err := os.Create(filepath.Join(probe, "a"))
	if err != nil {
		return false, fmt.Errorf("probing storage driver: %w", err)
	}
	defer src.Close()
	if _, err := src.Write([]byte("agentbox reflink probe\n")); err != nil {
		return false, fmt.Errorf("probing storage driver: %w", err)
	}
	dst, err := os.Create(filepath.Join(probe, "b"))
	if err != nil {
		return false, fmt.Errorf("probing storage driver: %w", err)
	}
	defer dst.Close()
	return unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil, nil
}

// cloneFile makes dst share src's data (FICLONE). It reports false when the
// filesystem cannot (then dst is still empty and the caller copies).
func cloneFile(dst, src *os.File) (bool, error) {
	err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL),
		errors.Is(err, unix.ENOTTY), errors.Is(err, unix.ENOSYS):
		return false, nil
	}
	return false, &os.PathError{Op: "ficlone", Path: dst.Name(), Err: err}
}

// copyData copies src's bytes to dst, sharing them when reflink is set and
// the filesystem can.
func copyData(dst, src *os.File, reflink bool) error {
	if reflink {
		ok, err := cloneFile(dst, src)
		if err != nil || ok {
			return err
		}
	}
	_, err := io.Copy(dst, src)
	return err
}

// Option configures New.
type Option func(*Store)

// WithLogger makes the store log to l (the daemon's configured logger);
// without it the store logs nothing.
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithDriver makes the store use d instead of probing its filesystem.
func WithDriver(d Driver) Option { return func(s *Store) { s.driver = d } }

// Driver returns the store's storage driver.
func (s *Store) Driver() Driver { return s.driver }

// DriverByName returns the driver called name for the filesystem of dir:
// "auto" (or "") probes, "copy" always works, "reflink" fails with
// errdefs.ErrFailedPrecondition where FICLONE does not.
func DriverByName(name, dir string) (Driver, error) {
	switch name {
	case "", "auto":
		return ProbeDriver(dir)
	case "copy", "reflink":
		d, err := ProbeDriver(dir)
		if err != nil {
			return nil, err
		}
		if name == "copy" {
			return CopyDriver{fs: d.Features().Filesystem}, nil
		}
		if d.Name() != "reflink" {
			return nil, fmt.Errorf("storage driver reflink: the %s file system of %s cannot clone files: %w", d.Features().Filesystem, dir, errdefs.ErrFailedPrecondition)
		}
		return d, nil
	}
	return nil, fmt.Errorf("unknown storage driver %q: %w", name, errdefs.ErrInvalidArgument)
}

// WithMaxDepth sets the chain depth beyond which Bound squashes (0:
// DefaultMaxDepth).
func WithMaxDepth(n int) Option { return func(s *Store) { s.maxDepth = n } }

// MaxDepth returns the depth limit Bound applies by default.
func (s *Store) MaxDepth() int {
	if s.maxDepth <= 0 {
		return DefaultMaxDepth
	}
	return s.maxDepth
}

// WithDriverName makes the store use the driver called name (see
// DriverByName) on its filesystem.
func WithDriverName(name string) Option { return func(s *Store) { s.driverName = name } }
