// Package diskquota caps the size and inode count of a sandbox's writable
// layer with a filesystem of its own: a sparse image file formatted ext4
// (no reserved blocks, a fixed inode count) attached to a loop device and
// mounted by host root in a private location (nosuid, nodev). A sandbox
// that fills it gets ENOSPC; the host loses at most the image's size and
// other sandboxes are untouched.
//
// Loop devices are attached with LO_FLAGS_AUTOCLEAR, so the device goes
// away with the last mount of its filesystem: Unmount leaves no device
// behind. Images are sparse: an empty 1 GiB quota costs a few MiB of host
// disk (ext4 metadata) until it is written.
//
// Mounts made on the host are copied into every mount namespace created
// afterwards, including prespawned sandbox guests still waiting for their
// config. Parent (the directory the quota filesystems are mounted under)
// is therefore made a shared mount (Share): a slave copy in such a
// namespace follows the host's mounts and unmounts, so an unmount leaves no
// copy pinning the filesystem, and a guest that was spawned before its
// sandbox's filesystem was mounted still sees it.
package diskquota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Limits bound one quota filesystem.
type Limits struct {
	Bytes  int64 // size of the filesystem; at least MinBytes
	Inodes int64 // inode count; 0: ext4's default for the size
}

// MinBytes is the smallest quota: ext4's metadata and journal need room.
const MinBytes = 16 << 20

// Error is a failed system call or tool run on a quota filesystem.
type Error struct {
	Op   string // "mkfs", "losetup", "mount", "umount2", ...
	Path string
	Err  error
}

func (e *Error) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Available reports whether quota filesystems can be made here: mkfs.ext4
// is installed and /dev/loop-control exists.
func Available() error {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("disk quotas need mkfs.ext4 (package e2fsprogs): %w", errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("disk quotas need loop devices: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Create makes image, a sparse file formatted ext4 with lim, whose root
// directory is mode 0711 owned by host root. image must not exist.
func Create(ctx context.Context, image string, lim Limits) (err error) {
	if lim.Bytes < MinBytes {
		return fmt.Errorf("disk quota %d bytes is below the minimum %d: %w", lim.Bytes, MinBytes, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(image, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return &Error{Op: "create", Path: image, Err: err}
	}
	defer func() {
		if err != nil {
			_ = os.Remove(image)
		}
	}()
	terr := f.Truncate(lim.Bytes)
	if cerr := f.Close(); terr == nil {
		terr = cerr
	}
	if terr != nil {
		return &Error{Op: "truncate", Path: image, Err: terr}
	}
	args := []string{"-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-O", "^resize_inode"}
	if lim.Inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(lim.Inodes, 10))
	}
	args = append(args, image)
	cmd := exec.CommandContext(ctx, "mkfs.ext4", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return &Error{Op: "mkfs.ext4", Path: image, Err: fmt.Errorf("%w: %s", err, bytes.TrimSpace(out.Bytes()))}
	}
	return nil
}

// Mount attaches image to a free loop device (auto-clearing) and mounts it
// at dir (nosuid, nodev). Mounting what is mounted already does nothing.
func Mount(image, dir string) error {
	if ok, err := IsMountPoint(dir); err != nil {
		return err
	} else if ok {
		return nil
	}
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return &Error{Op: "open", Path: image, Err: err}
	}
	defer img.Close()
	dev, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer dev.Close() // the mount holds the device; autoclear frees it after
	if err := unix.Mount(dev.Name(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, ""); err != nil {
		return &Error{Op: "mount", Path: dir, Err: err}
	}
	return nil
}

// attachLoop binds img to a free loop device and returns the device opened.
// Two callers may be handed the same free device; the loser retries.
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, &Error{Op: "open", Path: "/dev/loop-control", Err: err}
	}
	defer ctl.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, &Error{Op: "LOOP_CTL_GET_FREE", Path: "/dev/loop-control", Err: err}
		}
		name := "/dev/loop" + strconv.Itoa(n)
		dev, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && attempt < 20 {
				time.Sleep(time.Millisecond) // udev-less hosts: the node appears shortly
				continue
			}
			return nil, &Error{Op: "open", Path: name, Err: err}
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) || attempt >= 20 {
			return nil, &Error{Op: "LOOP_CONFIGURE", Path: name, Err: err}
		}
	}
}

// Unmount unmounts dir when it is a mount point; the loop device clears
// itself once no mount namespace holds the filesystem.
func Unmount(dir string) error {
	ok, err := IsMountPoint(dir)
	if err != nil || !ok {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := unix.Unmount(dir, 0); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return &Error{Op: "umount2", Path: dir, Err: err}
		}
		// A process of ours still has a file open below dir (a checkpoint
		// copy being cancelled): detach now, the kernel finishes later.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return &Error{Op: "umount2", Path: dir, Err: err}
		}
	}
	return nil
}

// IsMountPoint reports whether dir is the root of a mount.
func IsMountPoint(dir string) (bool, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, &Error{Op: "statx", Path: dir, Err: os.ErrNotExist}
		}
		return false, &Error{Op: "statx", Path: dir, Err: err}
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, &Error{Op: "statx", Path: dir, Err: errors.New("kernel does not report mount roots")}
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// Share makes dir a shared mount (bind-mounting it onto itself first when
// it is not a mount point), so mounts below it propagate to the slave
// copies in mount namespaces created later. Idempotent.
func Share(dir string) error {
	ok, err := IsMountPoint(dir)
	if err != nil {
		return err
	}
	if !ok {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return &Error{Op: "mount --rbind", Path: dir, Err: err}
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return &Error{Op: "mount --make-shared", Path: dir, Err: err}
	}
	return nil
}

// Unshare undoes Share's bind mount of dir, lazily: files of the daemon's
// still open below dir (prespawned guests' logs) keep the detached bind
// alive until closed. Call it only when no quota filesystem is mounted
// below dir.
func Unshare(dir string) error {
	ok, err := IsMountPoint(dir)
	if err != nil || !ok {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return &Error{Op: "umount2", Path: dir, Err: err}
	}
	return nil
}

// Usage is what a mounted quota filesystem holds.
type Usage struct {
	Bytes, BytesTotal   int64
	Inodes, InodesTotal int64
}

// Stat reports the usage of the filesystem mounted at dir.
func Stat(dir string) (Usage, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return Usage{}, &Error{Op: "statfs", Path: dir, Err: err}
	}
	bs := int64(fs.Bsize)
	return Usage{
		Bytes:       (int64(fs.Blocks) - int64(fs.Bfree)) * bs,
		BytesTotal:  int64(fs.Blocks) * bs,
		Inodes:      int64(fs.Files) - int64(fs.Ffree),
		InodesTotal: int64(fs.Files),
	}, nil
}
