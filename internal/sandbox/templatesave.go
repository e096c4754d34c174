package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// SaveTemplate freezes sandbox id's filesystem as a new immutable version
// of the saved template name (see internal/templates/saved.go): its
// writable layer is captured (frozen meanwhile, like a checkpoint) on top
// of the layers it runs on, and the sandbox's environment becomes the
// version's default. Sandboxes created from the version start with its
// tree hash.
func (m *Manager) SaveTemplate(ctx context.Context, id string, req api.SaveTemplateRequest) (_ api.TemplateVersion, err error) {
	defer func() { m.observeID(ctx, OpSaveTemplate, id, req.Name, err) }()
	if m.cfg.Layers == nil {
		return api.TemplateVersion{}, fmt.Errorf("saving templates needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	b, unlock, err := m.lockRunning(ctx, id)
	if err != nil {
		return api.TemplateVersion{}, err
	}
	defer unlock()
	b.mu.Lock()
	lowers, env := slices.Clone(b.rec.Layers), cloneMap(b.rec.Sandbox.Env)
	b.mu.Unlock()
	if len(lowers) == 0 {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: it has no layers: %w", id, errdefs.ErrFailedPrecondition)
	}
	parent, err := m.cfg.Layers.ByPath(lowers[0])
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: top layer: %w", id, err)
	}
	layer, err := m.captureFrozen(ctx, b, parent.ID)
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: %w", id, err)
	}
	p := tenant.From(ctx)
	v, err := m.templates.Save(ctx, tenant.Qualify(p.Tenant, req.Name), layer.ID, env, id)
	if err != nil {
		// The captured layer may be shared with a checkpoint of identical
		// content; dropLayer removes it only when nothing holds it.
		m.dropLayer(context.WithoutCancel(ctx), layer.ID, "")
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s as template %s: %w", id, req.Name, err)
	}
	v.Name = p.Visible(v.Name)
	return v, nil
}

// TemplateVersions lists the versions of saved template name, as the
// caller of ctx sees it (its own first, then the catalogue's).
func (m *Manager) TemplateVersions(ctx context.Context, name string) ([]api.TemplateVersion, error) {
	p := tenant.From(ctx)
	err := fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	for _, q := range p.Lookup(name, true) {
		var vs []api.TemplateVersion
		if vs, err = m.templates.Versions(ctx, q); err == nil {
			for i := range vs {
				vs[i].Name = p.Visible(vs[i].Name)
			}
			return vs, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, err
		}
	}
	return nil, err
}
