package templatesvc

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
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// ExportTemplate returns the OCI image archive of template name (built);
// the caller closes it.
func (s *Templates) ExportTemplate(ctx context.Context, name string) (io.ReadCloser, error) {
	if s.ls == nil {
		return nil, fmt.Errorf("export needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	t, err := templates.Resolve(ctx, s.tm, tenant.From(ctx).Lookup(name, true), name, s.log)
	if err != nil {
		return nil, err
	}
	return oci.Export(ctx, s.ls, t.ID, oci.Image{Name: name, Env: t.Env, Created: t.CreatedAt})
}

// ImportTemplate creates (or replaces) template name from an image archive
// read from r: an OCI image archive or a `docker save` archive.
func (s *Templates) ImportTemplate(ctx context.Context, name string, r io.Reader) (api.Template, error) {
	return s.importTemplate(ctx, name, func(ls *layers.Store) (oci.Result, error) { return oci.ImportArchive(ctx, ls, r) })
}

// ImportTemplatePath creates (or replaces) template name from the OCI
// image layout (or unpacked `docker save`) directory path on the daemon
// host.
func (s *Templates) ImportTemplatePath(ctx context.Context, name, path string) (api.Template, error) {
	if !tenant.From(ctx).IsAdmin() {
		return api.Template{}, fmt.Errorf("importing from a daemon host path is for the admin tenant only; upload the archive instead: %w", errdefs.ErrPermissionDenied)
	}
	if !filepath.IsAbs(path) {
		return api.Template{}, fmt.Errorf("image path %q must be absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	return s.importTemplate(ctx, name, func(ls *layers.Store) (oci.Result, error) { return oci.ImportLayout(ctx, ls, path) })
}

func (s *Templates) importTemplate(ctx context.Context, name string, imp func(*layers.Store) (oci.Result, error)) (api.Template, error) {
	if s.ls == nil {
		return api.Template{}, fmt.Errorf("import needs a layer store: %w", errdefs.ErrFailedPrecondition)
	}
	if !layerNameRE.MatchString(name) {
		return api.Template{}, fmt.Errorf("template name %q: want [a-z0-9][a-z0-9._-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	start := time.Now()
	res, err := imp(s.ls)
	if err != nil {
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	top, err := s.ls.Bound(ctx, res.Top, 0)
	if err != nil {
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	p := tenant.From(ctx)
	t, err := s.tm.Adopt(ctx, tenant.Qualify(p.Tenant, name), top.ID, res.Env)
	if err != nil {
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			// Over the tenant's disk quota: the layers this import wrote
			// go now, not when the collector finds them.
			s.discardNewLayers(context.WithoutCancel(ctx), start, top.ID, res.Top)
		}
		return api.Template{}, fmt.Errorf("importing template %s: %w", name, err)
	}
	s.log.InfoContext(ctx, "template imported", "template", t.Name, "id", t.ID, "layers", res.Layers)
	a := t.API()
	a.Tenant, _ = tenant.Split(t.Name)
	a.Name = p.Visible(t.Name)
	return a, nil
}

// discardNewLayers removes, from each of tops down its chain, the layers
// created since start that nothing references and nothing is stacked on:
// what a refused import wrote. A layer that existed before (shared by
// content with another template) and everything below it are kept.
func (s *Templates) discardNewLayers(ctx context.Context, start time.Time, tops ...string) {
	for _, id := range tops {
		for id != "" {
			l, err := s.ls.Get(id)
			if err != nil || len(l.Refs) > 0 || l.CreatedAt.Before(start) {
				break
			}
			if err := s.ls.Remove(ctx, l.ID); err != nil {
				if !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
					s.log.WarnContext(ctx, "removing refused layer", "layer", l.ID, "err", err)
				}
				break
			}
			id = l.Parent
		}
	}
}

var layerNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
