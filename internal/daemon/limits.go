package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// setupDiskQuota chooses how sandboxes' disk limits are enforced
// (diskquota.Detect: XFS project quotas when <data>/sandboxes is on XFS
// mounted with prjquota, loop-mounted ext4 images otherwise). With the
// loop method it makes <data>/sandboxes a shared mount: sandboxes' quota
// filesystems are mounted below it, and prespawned guests, whose mount
// namespaces are copies taken before those mounts, must follow the host's
// mounts and unmounts. Without that disk quotas still work but a deleted
// sandbox's filesystem could stay pinned by a guest spawned while it was
// mounted. Call it before any guest is spawned.
func setupDiskQuota(dataDir string, log *slog.Logger) (sandbox.DiskQuota, error) {
	dir := filepath.Join(dataDir, "sandboxes")
	q, why := diskquota.Detect(dir, filepath.Join(dataDir, "disks"))
	if q == nil {
		log.Info("disk quotas unavailable", "reason", why)
		return nil, why
	}
	if why != nil {
		log.Info("disk quotas", "method", q.Method(), "xfs_project_unavailable", why)
	} else {
		log.Info("disk quotas", "method", q.Method())
	}
	if _, ok := q.(diskquota.Mounter); ok {
		if err := diskquota.Share(dir); err != nil {
			log.Warn("preparing disk quotas", "err", err)
		}
	}
	return q, nil
}

// protectSandboxesDir makes <data>/sandboxes, where every sandbox's
// writable layer lives, a mount of its own with nosuid and nodev (a bind
// mount onto itself, made once; a restarted daemon finds it and only
// re-applies the flags): a setuid binary or device node a sandbox plants
// in its upper dir is inert on the host, whatever path or descriptor
// reaches it. Call it before any sandbox is created.
//
// undo takes back what this call did, for a daemon that fails to start:
// it unmounts the bind mount when this call made it (lazily: files the
// daemon opened below it may still be open), and does nothing when the
// mount was there already (a previous daemon's, kept for its sandboxes).
func protectSandboxesDir(dataDir string) (undo func() error, err error) {
	dir := filepath.Join(dataDir, "sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandboxes dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandboxes dir: %w", err)
	}
	mounted, err := diskquota.IsMountPoint(dir)
	if err != nil {
		return nil, fmt.Errorf("sandboxes dir: %w", err)
	}
	undo = func() error { return nil }
	if !mounted {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("bind-mounting the sandboxes dir %s: %w", dir, err)
		}
		undo = func() error {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmounting the sandboxes dir %s: %w", dir, err)
			}
			return nil
		}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, &attr); err != nil {
		_ = undo()
		return nil, fmt.Errorf("making the sandboxes dir %s nosuid,nodev: %w", dir, err)
	}
	return undo, nil
}

// closeLimits, once the warm pools are drained, deletes the template disk
// image and, when no sandbox dir is left (so no writable layer needs the
// nosuid,nodev mount) and no quota filesystem is mounted, undoes the
// sandboxes dir's own mount so the data dir is an ordinary directory
// again. While sandboxes remain (a restart) the mount stays, and the next
// daemon re-adopts it.
func closeLimits(dq sandbox.DiskQuota, dataDir string, log *slog.Logger) {
	if err := closeDisks(dq); err != nil {
		log.Warn("deleting the template disk image", "err", err)
	}
	dir := filepath.Join(dataDir, "sandboxes")
	if diskMounted(dq, dir) || hasSandboxDirs(dir) {
		return
	}
	if err := diskquota.Unshare(dir); err != nil {
		log.Warn("unmounting the sandboxes dir", "err", err)
	}
}

// hasSandboxDirs reports whether dir holds a sandbox's directory (names
// starting with "." are the backend's, not sandboxes).
func hasSandboxDirs(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			return true
		}
	}
	return false
}

// diskPreparer is a disk quota that can make the filesystem of one limit
// once and copy it at Apply, so a create of that limit does not wait for
// mkfs (diskquota.Loop.KeepTemplate).
type diskPreparer interface {
	// KeepTemplate makes the template filesystem of lim.
	KeepTemplate(ctx context.Context, lim diskquota.Limits) error
	// Close deletes it. Idempotent.
	Close() error
}

var _ diskPreparer = (*diskquota.Loop)(nil)

// prepareDisks makes dq prepare the filesystem of the daemon's default
// disk limit once, when its method makes filesystems (loop) and the
// daemon has a default; closeDisks undoes it.
func prepareDisks(ctx context.Context, dq sandbox.DiskQuota, cfg *config.Config) error {
	dp, ok := dq.(diskPreparer)
	def := api.Resources{DiskBytes: cfg.DefaultResources.DiskBytes, DiskInodes: cfg.DefaultResources.DiskInodes}
	if !ok || def.DiskBytes == 0 {
		return nil
	}
	lim := diskquota.Limits{Bytes: def.DiskBytes, Inodes: sandbox.DefaultInodes(def, def.DiskBytes)}
	if err := dp.KeepTemplate(ctx, lim); err != nil {
		return fmt.Errorf("preparing disks: %w", err)
	}
	return nil
}

// closeDisks deletes what prepareDisks made.
func closeDisks(dq sandbox.DiskQuota) error {
	if dp, ok := dq.(diskPreparer); ok {
		return dp.Close()
	}
	return nil
}

// diskMounted reports whether any sandbox's quota filesystem is mounted
// below dir, <data>/sandboxes (the daemon keeps it shared while one is).
func diskMounted(dq sandbox.DiskQuota, dir string) bool {
	if _, ok := dq.(diskquota.Mounter); !ok {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if ok, _ := diskquota.IsMountPoint(filepath.Join(dir, e.Name())); ok {
			return true
		}
	}
	return false
}
