package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/layergc"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
)

var _ httpapi.StorageService = service{}

// layerOptions maps the config onto the layer store, which logs to log.
func layerOptions(cfg *config.Config, log *slog.Logger) []layers.Option {
	return []layers.Option{layers.WithDriverName(cfg.StorageDriver), layers.WithMaxDepth(cfg.MaxLayerDepth), layers.WithLogger(log)}
}

// Info adds the storage driver to the Manager's description.
func (s service) Info(ctx context.Context) (api.Info, error) {
	info, err := s.Manager.Info(ctx)
	if err != nil {
		return info, err
	}
	info.StorageDriver = s.Collector.StorageDriver()
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
	s.gc.trigger()
	return nil
}

// DeleteCheckpoint deletes, then collects layers nothing uses any more.
func (s service) DeleteCheckpoint(ctx context.Context, cid string) error {
	if err := s.Snapshots.DeleteCheckpoint(ctx, cid); err != nil {
		return err
	}
	s.gc.trigger()
	return nil
}

// gcSpacing is the least time between the end of one background
// collection and the start of the next: a burst of deletes is collected
// in a few runs, not one per delete.
const gcSpacing = 250 * time.Millisecond

// collector runs background collections, sparing layers used in the last
// layergc.DefaultMinAge: one at a time, and a trigger that
// comes during a run makes one more run after it, so no delete's garbage
// waits for the next delete. Safe for concurrent use.
type collector struct {
	collect func(context.Context) error
	log     *slog.Logger

	// mu guards the fields below.
	mu      sync.Mutex
	running bool // a run is under way or about to start
	again   bool // triggered during the run: run once more
}

// The core tells the collector the layers its sandboxes run on.
var _ layergc.Sandboxes = (*sandbox.Manager)(nil)

func newCollector(gc *layergc.Collector, log *slog.Logger) *collector {
	return &collector{log: log, collect: func(ctx context.Context) error {
		_, err := gc.CollectGarbage(ctx, layergc.DefaultMinAge)
		return err
	}}
}

func (c *collector) logger() *slog.Logger {
	if c.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.log
}

// trigger asks for a collection soon; it never blocks.
func (c *collector) trigger() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		c.again = true
		return
	}
	c.running = true
	go c.run()
}

func (c *collector) run() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if err := c.collect(ctx); err != nil {
			c.logger().Warn("collecting layers", "err", err)
		}
		cancel()
		c.mu.Lock()
		if !c.again {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.again = false
		c.mu.Unlock()
		time.Sleep(gcSpacing)
	}
}

// collectAtStart runs once the sandboxes are recovered and before the API
// serves: nothing is between creating a layer and referencing it, so every
// unused layer goes (leftovers of crashes, replaced template builds).
func collectAtStart(ctx context.Context, gc *layergc.Collector, log *slog.Logger) {
	res, err := gc.CollectGarbage(ctx, 0)
	if err != nil {
		log.WarnContext(ctx, "collecting layers at start-up", "err", err)
		return
	}
	log.InfoContext(ctx, "layer store ready", "driver", gc.StorageDriver(), "layers", res.Layers, "collected", res.RemovedLayers, "freed_bytes", res.FreedBytes)
}
