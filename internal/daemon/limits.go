package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The Manager's warm pools reach the HTTP edge through the service adapter.
var _ httpapi.PoolService = service{}

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
	if err := os.MkdirAll(dir, 0o711); err != nil {
		log.Warn("preparing disk quotas", "err", err)
		return nil, err
	}
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

// closeLimits deletes the pooled sandboxes and, when no quota filesystem
// is mounted any more, undoes setupDiskQuota's shared mount so the data
// dir is an ordinary directory again.
func closeLimits(m *sandbox.Manager, dataDir string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.DrainPools(ctx)
	if err := m.CloseDisks(); err != nil {
		log.Warn("deleting the template disk image", "err", err)
	}
	if m.DiskMounted() {
		return
	}
	if err := diskquota.Unshare(filepath.Join(dataDir, "sandboxes")); err != nil {
		log.Warn("unmounting the sandboxes dir", "err", err)
	}
}
