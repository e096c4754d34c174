package sandbox

import (
	"context"
	"fmt"
	"os"

	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// Disk quotas: a sandbox whose resources set disk_bytes has its sandbox dir
// capped (internal/diskquota; the daemon picks the method). The cap is
// applied to the fresh, empty dir before its upper, work and state dirs
// are made, so those (and the trash of restores) are all under it and
// every rename among them stays inside:
//
//   - with XFS project quotas the dir is a plain directory carrying a
//     project id of its own;
//   - with loop ext4 the dir is the mount point of the sandbox's own
//     filesystem (a diskMounter), mounted while a guest may run (create,
//     wake, restore) and unmounted on hibernate. The daemon makes
//     <data>/sandboxes a shared mount before any guest is spawned
//     (diskquota.Share): prespawned guests hold slave copies of it, so an
//     unmount on the host reaches them and nothing pins a deleted
//     sandbox's filesystem.
//
// Every sandbox has disk_bytes unless the daemon's config turned the
// default disk limit off (limits.go). Deleting the sandbox removes the
// quota; Recover removes the quotas of sandboxes with no record. A fork
// has its checkpoint's resources and a quota of its own.

// DiskQuota caps the disk use of sandbox dirs; diskquota.Detect returns
// one. The contract (diskquota.Quota's): the Manager creates the dir empty
// before Apply and removes it after Remove; calls for one sandbox do not
// overlap; Apply leaves nothing behind on error; Remove is idempotent;
// Usage fails with errdefs.ErrNotFound when no quota is in force.
type DiskQuota interface {
	// Method names the method for api.Info ("xfs-project", "loop-ext4").
	Method() string
	// Apply caps dir, the fresh empty dir of sandbox id, at lim.
	Apply(ctx context.Context, dir, id string, lim diskquota.Limits) error
	// Usage reports what dir holds against its limits.
	Usage(dir, id string) (diskquota.Usage, error)
	// Remove deletes what dir holds under its quota and frees the quota.
	Remove(ctx context.Context, dir, id string) error
	// IDs lists the sandboxes that have a quota, a previous daemon's too.
	IDs() ([]string, error)
}

// diskMounter is a DiskQuota whose sandbox dirs are filesystems of their
// own, mounted only while a guest may run.
type diskMounter interface {
	// Mount mounts sandbox id's filesystem at dir when it has one.
	Mount(dir, id string) error
	// Unmount unmounts dir when it is mounted.
	Unmount(dir string) error
}

var (
	_ DiskQuota   = (*diskquota.Project)(nil)
	_ DiskQuota   = (*diskquota.Loop)(nil)
	_ diskMounter = (*diskquota.Loop)(nil)
)

// hasDisk reports whether rec's sandbox asks for a disk quota.
func hasDisk(rec store.SandboxRecord) bool { return rec.Sandbox.Resources.DiskBytes > 0 }

// diskAvailable says why sandboxes cannot have disk quotas here; nil when
// they can.
func (m *Manager) diskAvailable() error {
	if m.cfg.DiskQuota != nil {
		return nil
	}
	if m.cfg.DiskQuotaErr != nil {
		return fmt.Errorf("disk quotas are unavailable: %w", m.cfg.DiskQuotaErr)
	}
	return fmt.Errorf("disk quotas are not configured: %w", errdefs.ErrFailedPrecondition)
}

// createDisk caps rec's (empty, fresh) sandbox dir. On error nothing of
// the quota is left.
func (m *Manager) createDisk(ctx context.Context, rec store.SandboxRecord) error {
	if err := m.diskAvailable(); err != nil {
		return err
	}
	r := rec.Sandbox.Resources
	if err := m.cfg.DiskQuota.Apply(ctx, m.paths(rec.Sandbox.ID).dir, rec.Sandbox.ID, diskquota.Limits{Bytes: r.DiskBytes, Inodes: r.DiskInodes}); err != nil {
		return fmt.Errorf("disk quota: %w", err)
	}
	return nil
}

// makeSandboxDir makes rec's sandbox dir with its disk quota, when it asks
// for one, and the empty upper and work dirs inside it (so they are under
// the cap). remove undoes all of it; on error nothing is left.
func (m *Manager) makeSandboxDir(ctx context.Context, rec store.SandboxRecord) (remove func(), err error) {
	id := rec.Sandbox.ID
	p := m.paths(id)
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating dir: %w", err)
	}
	remove = func() { _ = os.RemoveAll(p.dir) }
	if hasDisk(rec) {
		if err := m.createDisk(ctx, rec); err != nil {
			remove()
			return nil, err
		}
		remove = func() {
			_ = m.removeDisk(context.WithoutCancel(ctx), id)
			_ = os.RemoveAll(p.dir)
		}
	}
	if err := m.mkUpperWork(p); err != nil {
		remove()
		return nil, fmt.Errorf("creating upper and work dirs: %w", err)
	}
	return remove, nil
}

// mountDisk mounts rec's quota filesystem at its sandbox dir when the
// method has them and it is not mounted.
func (m *Manager) mountDisk(rec store.SandboxRecord) error {
	dm, ok := m.cfg.DiskQuota.(diskMounter)
	if !ok || !hasDisk(rec) {
		return nil
	}
	if err := dm.Mount(m.paths(rec.Sandbox.ID).dir, rec.Sandbox.ID); err != nil {
		return fmt.Errorf("mounting disk of sandbox %s: %w", rec.Sandbox.ID, err)
	}
	return nil
}

// unmountDisk unmounts sandbox id's quota filesystem, when the method has
// them and it is mounted.
func (m *Manager) unmountDisk(id string) error {
	dm, ok := m.cfg.DiskQuota.(diskMounter)
	if !ok {
		return nil
	}
	if err := dm.Unmount(m.paths(id).dir); err != nil {
		return fmt.Errorf("unmounting disk of sandbox %s: %w", id, err)
	}
	return nil
}

// removeDisk removes sandbox id's quota (and with it what its dir holds),
// when it has one. Idempotent.
func (m *Manager) removeDisk(ctx context.Context, id string) error {
	if m.cfg.DiskQuota == nil {
		return nil
	}
	if err := m.cfg.DiskQuota.Remove(context.WithoutCancel(ctx), m.paths(id).dir, id); err != nil {
		return fmt.Errorf("removing disk of sandbox %s: %w", id, err)
	}
	return nil
}

// removeOrphanDisks removes the quotas of sandboxes with no record
// (Recover).
func (m *Manager) removeOrphanDisks(ctx context.Context, known map[string]bool) {
	if m.cfg.DiskQuota == nil {
		return
	}
	ids, err := m.cfg.DiskQuota.IDs()
	if err != nil {
		m.log.ErrorContext(ctx, "listing disk quotas", "err", err)
		return
	}
	for _, id := range ids {
		if known[id] || !idRE.MatchString(id) {
			continue
		}
		m.log.WarnContext(ctx, "removing orphaned disk", "sandbox", id)
		if err := m.removeDisk(ctx, id); err != nil {
			m.log.ErrorContext(ctx, "removing orphaned disk", "sandbox", id, "err", err)
		}
	}
}

// diskUsage reports the usage of sandbox id's quota; ok is false when it
// has none in force (none applied, or a filesystem not mounted).
func (m *Manager) diskUsage(id string) (diskquota.Usage, bool) {
	if m.cfg.DiskQuota == nil {
		return diskquota.Usage{}, false
	}
	u, err := m.cfg.DiskQuota.Usage(m.paths(id).dir, id)
	return u, err == nil
}

// diskQuotaMethod names how disk quotas are enforced ("" when they are
// unavailable).
func (m *Manager) diskQuotaMethod() string {
	if m.cfg.DiskQuota == nil {
		return ""
	}
	return m.cfg.DiskQuota.Method()
}
