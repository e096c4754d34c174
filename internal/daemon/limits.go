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

// shareSandboxDir makes <data>/sandboxes a shared mount when disk quotas
// can be made here (internal/diskquota): sandboxes' quota filesystems are
// mounted below it, and prespawned guests, whose mount namespaces are
// copies taken before those mounts, must follow the host's mounts and
// unmounts. Without it disk quotas still work (sandboxes with a quota
// start cold) but a deleted sandbox's filesystem could stay pinned by a
// guest spawned while it was mounted.
func shareSandboxDir(dataDir string, log *slog.Logger) {
	if err := diskquota.Available(); err != nil {
		log.Info("disk quotas unavailable", "reason", err)
		return
	}
	dir := filepath.Join(dataDir, "sandboxes")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		log.Warn("preparing disk quotas", "err", err)
		return
	}
	if err := diskquota.Share(dir); err != nil {
		log.Warn("preparing disk quotas", "err", err)
	}
}

// closeLimits deletes the pooled sandboxes and, when no quota filesystem
// is mounted any more, undoes shareSandboxDir so the data dir is an
// ordinary directory again.
func closeLimits(m *sandbox.Manager, dataDir string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.DrainPools(ctx)
	if m.DiskMounted() {
		return
	}
	if err := diskquota.Unshare(filepath.Join(dataDir, "sandboxes")); err != nil {
		log.Warn("unmounting the sandboxes dir", "err", err)
	}
}
