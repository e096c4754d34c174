// Package layergc collects the garbage of the layer store: every layer
// that no template, checkpoint or sandbox uses. Layers stay alive while
// something holds a reference on them (templates, checkpoints, sandboxes
// running on a checkpoint) or a sandbox runs on them (every sandbox
// record's layers, also those created from a template whose reference has
// since moved to a newer build). A collection removes the rest: leftovers
// of a crash between a capture and its record, chains replaced by a
// squash, old template builds no sandbox uses.
//
// It sits above the sandbox core (internal/sandbox), which tells it the
// layers its sandboxes run on (LayersInUse) and never imports it.
package layergc

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// DefaultMinAge is the age below which background collections spare
// layers: they may be between creation and reference.
const DefaultMinAge = 10 * time.Minute

// Sandboxes is what the collector needs of the sandbox core;
// *sandbox.Manager implements it.
type Sandboxes interface {
	// LayersInUse returns the top layer directories of every sandbox.
	LayersInUse(ctx context.Context) ([]string, error)
}

var _ Sandboxes = (*sandbox.Manager)(nil)

// Collector removes unused layers. Its methods are safe for concurrent
// use (the layer store serialises removals).
type Collector struct {
	ls  *layers.Store
	sbx Sandboxes
	cks store.CheckpointStore
}

// New returns a collector of ls; checkpoints (nil: none) are the records
// of the checkpoints whose layers it keeps.
func New(ls *layers.Store, sbx Sandboxes, checkpoints store.CheckpointStore) *Collector {
	return &Collector{ls: ls, sbx: sbx, cks: checkpoints}
}

// StorageDriver returns the name of the layer store's driver, "" without
// a layer store.
func (c *Collector) StorageDriver() string {
	if c.ls == nil {
		return ""
	}
	return c.ls.Driver().Name()
}

// CollectGarbage removes every layer no template, checkpoint or sandbox
// uses and that was neither created nor looked up in the last minAge.
// Without a layer store it fails with ErrFailedPrecondition.
func (c *Collector) CollectGarbage(ctx context.Context, minAge time.Duration) (api.GCResult, error) {
	if c.ls == nil {
		return api.GCResult{}, fmt.Errorf("garbage collection needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	roots, err := c.roots(ctx)
	if err != nil {
		return api.GCResult{}, fmt.Errorf("collecting layers: %w", err)
	}
	res, err := c.ls.GC(ctx, layers.GCOptions{Roots: roots, MinAge: minAge})
	out := api.GCResult{RemovedLayers: len(res.Removed), FreedBytes: res.FreedBytes, Layers: res.Kept}
	if err != nil {
		return out, err
	}
	return out, nil
}

// roots returns the ids of the top layers in use by sandboxes and
// checkpoints.
func (c *Collector) roots(ctx context.Context) ([]string, error) {
	tops, err := c.sbx.LayersInUse(ctx)
	if err != nil {
		return nil, err
	}
	var roots []string
	for _, p := range tops {
		if l, err := c.ls.ByPath(p); err == nil {
			roots = append(roots, l.ID)
		}
	}
	if c.cks != nil {
		cks, err := c.cks.ListCheckpoints(ctx)
		if err != nil {
			return nil, err
		}
		for _, ck := range cks {
			roots = append(roots, ck.Layer)
		}
	}
	return roots, nil
}
