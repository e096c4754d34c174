package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/store"
)

// Disk quotas: a sandbox whose resources set disk_bytes gets a filesystem
// of its own (internal/diskquota) mounted at its sandbox dir, so its upper,
// work and state dirs (and the trash of restores) all live on it and every
// rename among them stays inside it. The image is <data>/disks/<id>.img,
// outside the mount. The filesystem is mounted while a guest may run
// (create, wake, restore) and unmounted on hibernate and delete; Recover
// removes images with no record.
//
// The daemon makes <data>/sandboxes a shared mount before any guest is
// spawned (diskquota.Share): prespawned guests hold slave copies of it, so
// an unmount on the host reaches them and nothing pins a deleted sandbox's
// filesystem.

func (m *Manager) disksDir() string { return filepath.Join(m.cfg.DataDir, "disks") }

func (m *Manager) diskImage(id string) string { return filepath.Join(m.disksDir(), id+".img") }

// hasDisk reports whether rec's sandbox has a quota filesystem.
func hasDisk(rec store.SandboxRecord) bool { return rec.Sandbox.Resources.DiskBytes > 0 }

// createDisk makes and mounts the quota filesystem of rec at its (empty,
// fresh) sandbox dir. On error nothing of it is left.
func (m *Manager) createDisk(ctx context.Context, rec store.SandboxRecord) error {
	if err := os.MkdirAll(m.disksDir(), 0o700); err != nil {
		return fmt.Errorf("disk quota: %w", err)
	}
	r := rec.Sandbox.Resources
	img := m.diskImage(rec.Sandbox.ID)
	if err := diskquota.Create(ctx, img, diskquota.Limits{Bytes: r.DiskBytes, Inodes: r.DiskInodes}); err != nil {
		return fmt.Errorf("disk quota: %w", err)
	}
	if err := m.mountDisk(rec); err != nil {
		_ = os.Remove(img)
		return err
	}
	return nil
}

// mountDisk mounts rec's quota filesystem at its sandbox dir when it has
// one and it is not mounted. The root stays traversable (0711) for the
// mapped ids.
func (m *Manager) mountDisk(rec store.SandboxRecord) error {
	if !hasDisk(rec) {
		return nil
	}
	img := m.diskImage(rec.Sandbox.ID)
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		return nil // made without a quota filesystem (a fork): nothing to mount
	}
	dir := m.paths(rec.Sandbox.ID).dir
	if err := diskquota.Mount(img, dir); err != nil {
		return fmt.Errorf("mounting disk of sandbox %s: %w", rec.Sandbox.ID, err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		_ = diskquota.Unmount(dir)
		return fmt.Errorf("mounting disk of sandbox %s: %w", rec.Sandbox.ID, err)
	}
	return nil
}

// unmountDisk unmounts sandbox id's quota filesystem, when mounted.
func (m *Manager) unmountDisk(id string) error {
	if err := diskquota.Unmount(m.paths(id).dir); err != nil {
		return fmt.Errorf("unmounting disk of sandbox %s: %w", id, err)
	}
	return nil
}

// removeDisk unmounts and deletes sandbox id's quota filesystem, when it
// has one. Idempotent.
func (m *Manager) removeDisk(id string) error {
	if err := m.unmountDisk(id); err != nil {
		return err
	}
	if err := os.Remove(m.diskImage(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing disk of sandbox %s: %w", id, err)
	}
	return nil
}

// removeOrphanDisks deletes images whose sandbox has no record (Recover).
func (m *Manager) removeOrphanDisks(ctx context.Context, known map[string]bool) {
	entries, err := os.ReadDir(m.disksDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || known[id] || !idRE.MatchString(id) {
			continue
		}
		m.log.WarnContext(ctx, "removing orphaned disk", "sandbox", id)
		if err := m.removeDisk(id); err != nil {
			m.log.ErrorContext(ctx, "removing orphaned disk", "sandbox", id, "err", err)
		}
	}
}

// DiskMounted reports whether any sandbox's quota filesystem is mounted
// (the daemon keeps <data>/sandboxes shared while one is).
func (m *Manager) DiskMounted() bool {
	entries, err := os.ReadDir(filepath.Join(m.cfg.DataDir, "sandboxes"))
	if err != nil {
		return false
	}
	for _, e := range entries {
		if ok, _ := diskquota.IsMountPoint(filepath.Join(m.cfg.DataDir, "sandboxes", e.Name())); ok {
			return true
		}
	}
	return false
}

// DiskUsage reports the usage of sandbox id's quota filesystem; ok is false
// when it has none mounted.
func (m *Manager) diskUsage(id string) (diskquota.Usage, bool) {
	dir := m.paths(id).dir
	if ok, _ := diskquota.IsMountPoint(dir); !ok {
		return diskquota.Usage{}, false
	}
	u, err := diskquota.Stat(dir)
	return u, err == nil
}
