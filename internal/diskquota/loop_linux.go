package diskquota

// The loop method: the sandbox dir is itself a filesystem, a sparse image
// file formatted ext4 (no reserved blocks, a fixed inode count) attached
// to a loop device and mounted by host root at the dir (nosuid, nodev). A
// sandbox that fills it gets ENOSPC; the host loses at most the image's
// size and other sandboxes are untouched.
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

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Loop is the loop method: each capped sandbox dir is an ext4 filesystem of
// its own, whose image is <Images>/<id>.img (outside the dirs).
type Loop struct {
	Images string // the directory holding the images

	// tmplMu guards tmpl (template_linux.go).
	tmplMu sync.Mutex
	tmpl   *loopTemplate
}

// NewLoop returns the loop method keeping its images in images, or why it
// cannot work here (errdefs.ErrFailedPrecondition).
func NewLoop(images string) (*Loop, error) {
	if err := loopAvailable(); err != nil {
		return nil, err
	}
	return &Loop{Images: images}, nil
}

func (l *Loop) image(id string) string { return filepath.Join(l.Images, id+".img") }

// Method implements Quota.
func (l *Loop) Method() string { return MethodLoop }

// Apply implements Quota: it makes sandbox id's image and mounts it at dir,
// whose root stays traversable (0711) for the sandboxes' mapped ids.
func (l *Loop) Apply(ctx context.Context, dir, id string, lim Limits) error {
	if err := os.MkdirAll(l.Images, 0o700); err != nil {
		return &Error{Op: "mkdir", Path: l.Images, Err: err}
	}
	img := l.image(id)
	if !l.fromTemplate(img, lim) {
		if err := createImage(ctx, img, lim); err != nil {
			return err
		}
	}
	if err := l.Mount(dir, id); err != nil {
		_ = os.Remove(img)
		return err
	}
	return nil
}

// Mount implements Mounter. A sandbox without an image has nothing to
// mount.
func (l *Loop) Mount(dir, id string) error {
	img := l.image(id)
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := mountImage(img, dir); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		_ = unmount(dir)
		return &Error{Op: "chmod", Path: dir, Err: err}
	}
	return nil
}

// Unmount implements Mounter.
func (l *Loop) Unmount(dir string) error { return unmount(dir) }

// Usage implements Quota: the usage of the filesystem mounted at dir.
func (l *Loop) Usage(dir, id string) (Usage, error) {
	if ok, err := IsMountPoint(dir); err != nil || !ok {
		return Usage{}, fmt.Errorf("disk of sandbox %s is not mounted: %w", id, errdefs.ErrNotFound)
	}
	return statFS(dir)
}

// Remove implements Quota: it unmounts dir and deletes the image.
func (l *Loop) Remove(ctx context.Context, dir, id string) error {
	if err := unmount(dir); err != nil {
		return err
	}
	if err := os.Remove(l.image(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return &Error{Op: "remove", Path: l.image(id), Err: err}
	}
	return nil
}

// IDs implements Quota: the sandboxes that have an image.
func (l *Loop) IDs() ([]string, error) {
	return imageIDs(l.Images)
}

// imageIDs lists the ids of the images in dir (none when dir is missing).
func imageIDs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &Error{Op: "readdir", Path: dir, Err: err}
	}
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".img"); ok && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// loopAvailable reports whether quota filesystems can be made here:
// mkfs.ext4 is installed and /dev/loop-control exists.
func loopAvailable() error {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("disk quotas need mkfs.ext4 (package e2fsprogs): %w", errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("disk quotas need loop devices: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// createImage makes image, a sparse file formatted ext4 with lim, whose root
// directory is mode 0711 owned by host root. image must not exist.
func createImage(ctx context.Context, image string, lim Limits) (err error) {
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
		args = append(args, "-b", strconv.Itoa(imageBlock), "-I", strconv.Itoa(imageInode), "-N", strconv.FormatInt(imageInodes(lim), 10))
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

// The geometry of an image with an inode limit: fixed, so that the inode
// count mkfs makes can be computed (imageInodes).
const (
	imageBlock          = 4096
	imageInode          = 256
	imageGroupBlocks    = imageBlock * 8 // blocks per group: one bitmap block's bits
	imageInodesPerBlock = imageBlock / imageInode
)

// imageInodes is the -N that makes mkfs.ext4 create at most lim.Inodes
// inodes: it spreads them over the block groups in whole inode-table
// blocks, rounding up, so ask for what rounds down instead (at least one
// inode-table block per group: a tiny limit on a huge disk gets that).
// mkfs may drop a short last group: asking for one group fewer's worth
// then keeps the count at most the limit whether it drops it or not.
func imageInodes(lim Limits) int64 {
	blocks := lim.Bytes / imageBlock
	groups := (blocks + imageGroupBlocks - 1) / imageGroupBlocks
	perGroup := lim.Inodes / groups / imageInodesPerBlock * imageInodesPerBlock
	perGroup = min(max(perGroup, imageInodesPerBlock), imageGroupBlocks)
	if blocks%imageGroupBlocks != 0 && groups > 1 {
		return perGroup * (groups - 1)
	}
	return perGroup * groups
}

// mountImage attaches image to a free loop device (auto-clearing) and
// mounts it at dir (nosuid, nodev). Mounting what is mounted already does
// nothing.
func mountImage(image, dir string) error {
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
	// noinit_itable: the kernel would otherwise zero the inode tables that
	// mkfs left uninitialised (lazy_itable_init) in the background, writing
	// 128 MiB into the sparse image of a 512 Ki-inode filesystem for
	// nothing: unused inode slots past a group's high-water mark are never
	// read.
	if err := unix.Mount(dev.Name(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "noinit_itable"); err != nil {
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

// unmount unmounts dir when it is a mount point; the loop device clears
// itself once no mount namespace holds the filesystem.
func unmount(dir string) error {
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

// statFS reports the usage of the filesystem mounted at dir.
func statFS(dir string) (Usage, error) {
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

var (
	_ Quota   = (*Loop)(nil)
	_ Mounter = (*Loop)(nil)
)
