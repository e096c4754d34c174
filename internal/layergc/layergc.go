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
// layers its sandboxes run on (LayersInUse) and never imports it. It also
// measures the layers charged to a tenant's disk quota (LayerBytes), the
// tenant registry's layer meter.
package layergc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// DefaultMinAge is the age below which background collections spare
// layers: they may be between creation and reference.
const DefaultMinAge = 10 * time.Minute

// Sandboxes is what the collector needs of the sandbox core;
// *sandbox.Manager implements it (the guard is the daemon's, so that the
// core's own tests can measure layers with LayerBytes).
type Sandboxes interface {
	// LayersInUse returns the top layer directories of every sandbox.
	LayersInUse(ctx context.Context) ([]string, error)
}

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

// LayerBytes is the package's LayerBytes on the collector's layer store
// and checkpoint records (registry.Meters.Layers).
func (c *Collector) LayerBytes(ctx context.Context, owner string, extra []string) (int64, error) {
	return LayerBytes(ctx, c.ls, c.cks, owner, extra)
}

// LayerBytes returns the bytes on disk of the layers of ls charged to
// owner's disk quota: every layer in the chains of its checkpoints (the
// records of checkpoints; nil: none), of the layers its templates hold a
// reference on (saved versions, built and imported templates) and of
// extra, each layer once, leaving out every layer in the chains of the
// admin's templates (the shared catalogue every tenant builds on). A
// layer shared with another tenant is charged to both. Sizes come from
// the layers' metadata; no tree is walked. Without a layer store it is 0.
func LayerBytes(ctx context.Context, ls *layers.Store, checkpoints store.CheckpointStore, owner string, extra []string) (int64, error) {
	if ls == nil {
		return 0, nil
	}
	owner = tenant.Owner(owner)
	roots := slices.Clone(extra)
	if checkpoints != nil {
		recs, err := checkpoints.ListCheckpoints(ctx)
		if err != nil {
			return 0, err
		}
		for _, r := range recs {
			if tenant.Owner(r.Checkpoint.Tenant) == owner {
				roots = append(roots, r.Layer)
			}
		}
	}
	var shared []string
	for _, l := range ls.List() {
		for _, ref := range l.Refs {
			name, ok := templates.RefTemplate(ref)
			if !ok {
				continue
			}
			switch o, _ := tenant.Split(name); o {
			case owner:
				roots = append(roots, l.ID)
			case api.AdminTenant:
				shared = append(shared, l.ID)
			}
		}
	}
	return ls.ChainsSize(roots, shared), nil
}
