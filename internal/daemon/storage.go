package daemon

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
)

var _ httpapi.StorageService = service{}

// layerOptions maps the config onto the layer store.
func layerOptions(cfg *config.Config) []layers.Option {
	return []layers.Option{layers.WithDriverName(cfg.StorageDriver), layers.WithMaxDepth(cfg.MaxLayerDepth)}
}

// Info adds the storage driver to the Manager's description.
func (s service) Info(ctx context.Context) (api.Info, error) {
	info, err := s.Manager.Info(ctx)
	if err != nil {
		return info, err
	}
	info.StorageDriver = s.Manager.StorageDriver()
	if p := tenant.From(ctx); !p.IsAdmin() {
		// A tenant sees its own sandboxes, and no host path.
		info.DataDir = ""
		info.Sandboxes, _ = s.Manager.Holdings(p.Tenant)
	}
	return info, nil
}

// DeleteSandbox deletes, then collects layers nothing uses any more.
func (s service) DeleteSandbox(ctx context.Context, id string) error {
	if err := s.Manager.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	collectSoon(s.Manager)
	return nil
}

// DeleteCheckpoint deletes, then collects layers nothing uses any more.
func (s service) DeleteCheckpoint(ctx context.Context, cid string) error {
	if err := s.Manager.DeleteCheckpoint(ctx, cid); err != nil {
		return err
	}
	collectSoon(s.Manager)
	return nil
}

// gcRunning keeps background collections from piling up; a trigger that
// finds one running is covered by it or by the next.
var gcRunning atomic.Bool

// collectSoon collects garbage in the background, sparing layers used in
// the last sandbox.DefaultGCMinAge.
func collectSoon(m *sandbox.Manager) {
	if !gcRunning.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer gcRunning.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if _, err := m.CollectGarbage(ctx, sandbox.DefaultGCMinAge); err != nil {
			slog.Default().Warn("collecting layers", "err", err)
		}
	}()
}

// collectAtStart runs once the sandboxes are recovered and before the API
// serves: nothing is between creating a layer and referencing it, so every
// unused layer goes (leftovers of crashes, replaced template builds).
func collectAtStart(ctx context.Context, m *sandbox.Manager, log *slog.Logger) {
	res, err := m.CollectGarbage(ctx, 0)
	if err != nil {
		log.WarnContext(ctx, "collecting layers at start-up", "err", err)
		return
	}
	log.InfoContext(ctx, "layer store ready", "driver", m.StorageDriver(), "layers", res.Layers, "collected", res.RemovedLayers, "freed_bytes", res.FreedBytes)
}
