package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/oci"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Layer storage: the driver in use, chain depth and garbage collection.
//
// Layers stay alive while something holds a reference (templates,
// checkpoints, sandboxes running on a checkpoint) or a sandbox runs on them
// (every sandbox record's Layers, also those created from a template whose
// reference has since moved to a newer build). CollectGarbage removes the
// rest: leftovers of a crash between a capture and its record, chains
// replaced by a squash, old template builds no sandbox uses.

// DefaultGCMinAge is the age below which CollectGarbage spares layers
// unless told otherwise: they may be between creation and reference.
const DefaultGCMinAge = 10 * time.Minute

// StorageDriver returns the name of the layer store's driver, "" without
// a layer store.
func (m *Manager) StorageDriver() string {
	if m.cfg.Layers == nil {
		return ""
	}
	return m.cfg.Layers.Driver().Name()
}

// CollectGarbage removes every layer no template, checkpoint or sandbox
// uses and that was neither created nor looked up in the last minAge.
func (m *Manager) CollectGarbage(ctx context.Context, minAge time.Duration) (api.GCResult, error) {
	ls := m.cfg.Layers
	if ls == nil {
		return api.GCResult{}, fmt.Errorf("garbage collection needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	roots, err := m.layerRoots(ctx)
	if err != nil {
		return api.GCResult{}, fmt.Errorf("collecting layers: %w", err)
	}
	res, err := ls.GC(ctx, layers.GCOptions{Roots: roots, MinAge: minAge})
	out := api.GCResult{RemovedLayers: len(res.Removed), FreedBytes: res.FreedBytes, Layers: res.Kept}
	if err != nil {
		return out, err
	}
	return out, nil
}

// layerRoots returns the top layers in use by sandboxes (in memory and in
// the store) and checkpoints.
func (m *Manager) layerRoots(ctx context.Context) ([]string, error) {
	ls := m.cfg.Layers
	var tops []string
	m.mu.Lock()
	for _, b := range m.sandboxes {
		b.mu.Lock()
		if len(b.rec.Layers) > 0 {
			tops = append(tops, b.rec.Layers[0])
		}
		b.mu.Unlock()
	}
	m.mu.Unlock()
	recs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if len(r.Layers) > 0 {
			tops = append(tops, r.Layers[0])
		}
	}
	var roots []string
	for _, p := range tops {
		if l, err := ls.ByPath(p); err == nil {
			roots = append(roots, l.ID)
		}
	}
	if cs, ok := m.store.(store.CheckpointStore); ok {
		cks, err := cs.ListCheckpoints(ctx)
		if err != nil {
			return nil, err
		}
		for _, c := range cks {
			roots = append(roots, c.Layer)
		}
	}
	return roots, nil
}

// ExportTemplate returns the OCI image archive of template name (built);
// the caller closes it.
func (m *Manager) ExportTemplate(ctx context.Context, name string) (io.ReadCloser, error) {
	if m.cfg.Layers == nil {
		return nil, fmt.Errorf("export needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	t, err := m.template(ctx, name)
	if err != nil {
		return nil, err
	}
	return oci.Export(ctx, m.cfg.Layers, t.ID, oci.Image{Name: name, Env: t.Env, Created: t.CreatedAt})
}

// ImportTemplate creates (or replaces) template name from an image archive
// read from r: an OCI image archive or a `docker save` archive.
func (m *Manager) ImportTemplate(ctx context.Context, name string, r io.Reader) (api.Template, error) {
	return m.importTemplate(ctx, name, func(ls *layers.Store) (oci.Result, error) { return oci.ImportArchive(ctx, ls, r) })
}

// ImportTemplatePath creates (or replaces) template name from the OCI
// image layout (or unpacked `docker save`) directory path on the daemon
// host.
func (m *Manager) ImportTemplatePath(ctx context.Context, name, path string) (api.Template, error) {
	if !tenant.From(ctx).IsAdmin() {
		return api.Template{}, fmt.Errorf("importing from a daemon host path is for the admin tenant only; upload the archive instead: %w", errdefs.ErrPermissionDenied)
	}
	if !filepath.IsAbs(path) {
		return api.Template{}, fmt.Errorf("image path %q must be absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	return m.importTemplate(ctx, name, func(ls *layers.Store) (oci.Result, error) { return oci.ImportLayout(ctx, ls, path) })
}

func (m *Manager) importTemplate(ctx context.Context, name string, imp func(*layers.Store) (oci.Result, error)) (api.Template, error) {
	if m.cfg.Layers == nil {
		return api.Template{}, fmt.Errorf("import needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	if !layerNameRE.MatchString(name) {
		return api.Template{}, fmt.Errorf("template name %q: want [a-z0-9][a-z0-9._-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	start := time.Now()
	res, err := imp(m.cfg.Layers)
	if err != nil {
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	top, err := m.cfg.Layers.Bound(ctx, res.Top, 0)
	if err != nil {
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	p := tenant.From(ctx)
	t, err := m.templates.Adopt(ctx, tenant.Qualify(p.Tenant, name), top.ID, res.Env)
	if err != nil {
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			// Over the tenant's disk quota: the layers this import wrote
			// go now, not when the collector finds them.
			m.discardNewLayers(context.WithoutCancel(ctx), start, top.ID, res.Top)
		}
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	m.log.InfoContext(ctx, "template imported", "template", t.Name, "id", t.ID, "layers", res.Layers)
	a := t.API()
	a.Tenant, _ = tenant.Split(t.Name)
	a.Name = p.Visible(t.Name)
	return a, nil
}

// discardNewLayers removes, from each of tops down its chain, the layers
// created since start that nothing references and nothing is stacked on:
// what a refused import wrote. A layer that existed before (shared by
// content with another template) and everything below it are kept.
func (m *Manager) discardNewLayers(ctx context.Context, start time.Time, tops ...string) {
	ls := m.cfg.Layers
	for _, id := range tops {
		for id != "" {
			l, err := ls.Get(id)
			if err != nil || len(l.Refs) > 0 || l.CreatedAt.Before(start) {
				break
			}
			if err := ls.Remove(ctx, l.ID); err != nil {
				if !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
					m.log.WarnContext(ctx, "removing refused layer", "layer", l.ID, "err", err)
				}
				break
			}
			id = l.Parent
		}
	}
}

var layerNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
