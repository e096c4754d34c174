package templatesvc

import (
	"context"
	"fmt"
	"maps"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
)

// SaveTemplate freezes sandbox id's filesystem as a new immutable version
// of the saved template name (see internal/templates/saved.go): its
// writable layer is captured (frozen meanwhile, like a checkpoint) on top
// of the layers it runs on, and the sandbox's environment becomes the
// version's default. Sandboxes created from the version start with its
// tree hash. Observers see an OpSaveTemplate.
func (s *Templates) SaveTemplate(ctx context.Context, id string, req api.SaveTemplateRequest) (_ api.TemplateVersion, err error) {
	op := sandbox.Op{Kind: sandbox.OpSaveTemplate, Sandbox: id, Detail: req.Name}
	defer func() {
		op.Err = err
		s.sbx.Report(ctx, op)
	}()
	if s.ls == nil {
		return api.TemplateVersion{}, fmt.Errorf("saving templates needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	h, unlock, err := s.sbx.LockRunning(ctx, id)
	if err != nil {
		return api.TemplateVersion{}, err
	}
	defer unlock()
	upper, lowers := h.Dirs()
	env := maps.Clone(h.Sandbox().Env)
	if len(lowers) == 0 {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: it has no layers: %w", id, errdefs.ErrFailedPrecondition)
	}
	parent, err := s.ls.ByPath(lowers[0])
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: top layer: %w", id, err)
	}
	var layer layers.Layer
	err = h.Frozen(ctx, func() (err error) {
		layer, err = s.ls.CreateFromCopy(ctx, upper, layers.CreateOptions{Parent: parent.ID})
		return err
	})
	if err != nil {
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s: %w", id, err)
	}
	p := tenant.From(ctx)
	v, err := s.tm.Save(ctx, tenant.Qualify(p.Tenant, req.Name), layer.ID, env, id)
	if err != nil {
		// The captured layer may be shared with a checkpoint of identical
		// content; it goes only when nothing holds it.
		s.dropLayer(context.WithoutCancel(ctx), layer.ID)
		return api.TemplateVersion{}, fmt.Errorf("saving sandbox %s as template %s: %w", id, req.Name, err)
	}
	v.Name = p.Visible(v.Name)
	return v, nil
}

// dropLayer removes layer id, just captured for a save that failed, when
// nothing references it. A layer in use is kept (not an error).
func (s *Templates) dropLayer(ctx context.Context, id string) {
	l, err := s.ls.Get(id)
	if err != nil || len(l.Refs) > 0 {
		return
	}
	if err := s.ls.Remove(ctx, id); err != nil && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
		s.log.WarnContext(ctx, "removing layer", "layer", id, "err", err)
	}
}

// TemplateVersions lists the versions of saved template name, as the
// caller of ctx sees it (its own first, then the catalogue's).
func (s *Templates) TemplateVersions(ctx context.Context, name string) ([]api.TemplateVersion, error) {
	p := tenant.From(ctx)
	err := fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	for _, q := range p.Lookup(name, true) {
		var vs []api.TemplateVersion
		if vs, err = s.tm.Versions(ctx, q); err == nil {
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
