// Package templatesvc is the template service of the API: listing,
// describing and building templates, importing and exporting them as OCI
// images, and saving a sandbox's files as a new version of a template. It
// applies what the template store (internal/templates) does not know:
// tenants (each tenant's own namespace over the admin's catalogue, what
// only the admin may do) and the sandboxes a template is saved from.
//
// It sits above the sandbox core (internal/sandbox): a save freezes the
// sandbox through the core's API for features (LockRunning, Handle.Frozen,
// Report). The core creates sandboxes from the same template store and
// never imports this package. See docs/EXTENSIONS.md.
package templatesvc

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Sandboxes is what the service needs of the sandbox core;
// *sandbox.Manager implements it.
type Sandboxes interface {
	// LockRunning holds a running sandbox's lock exclusively while its
	// files are captured (core_snapshot.go).
	LockRunning(ctx context.Context, id string) (*sandbox.Handle, func(), error)
	// Report shows a save to the core's observers.
	Report(ctx context.Context, op sandbox.Op)
}

var _ Sandboxes = (*sandbox.Manager)(nil)

// Config configures Templates.
type Config struct {
	// Templates is the template store the core creates sandboxes from
	// (the one sandbox.Config.NewTemplates built).
	Templates sandbox.Templates
	// Layers is the layer store the templates live in; without it
	// imports, exports and saves fail with ErrFailedPrecondition.
	Layers    *layers.Store
	Sandboxes Sandboxes
	Logger    *slog.Logger
}

// Templates serves the template API. Its methods are safe for concurrent
// use: the template store orders its own changes, and a save holds the
// sandbox's lock.
type Templates struct {
	tm  sandbox.Templates
	ls  *layers.Store
	sbx Sandboxes
	log *slog.Logger
}

// New returns the service over cfg's stores.
func New(cfg Config) *Templates {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Templates{tm: cfg.Templates, ls: cfg.Layers, sbx: cfg.Sandboxes, log: log}
}

// ListTemplates lists the templates the caller of ctx can use: its own
// and the admin's catalogue (an own template hides a catalogue one of the
// same name). The admin sees every tenant's, named "<tenant>~<name>".
func (s *Templates) ListTemplates(ctx context.Context) ([]api.Template, error) {
	all, err := s.tm.List(ctx)
	if err != nil {
		return nil, err
	}
	p := tenant.From(ctx)
	own := map[string]bool{}
	for _, t := range all {
		if owner, name := tenant.Split(t.Name); owner == p.Tenant {
			own[name] = true
		}
	}
	out := []api.Template{}
	for _, t := range all {
		owner, name := tenant.Split(t.Name)
		if !p.Sees(owner) && owner != api.AdminTenant {
			continue
		}
		if owner == api.AdminTenant && !p.IsAdmin() && own[name] {
			continue
		}
		t.Tenant = owner
		t.Name = p.Visible(t.Name)
		out = append(out, t)
	}
	return out, nil
}

// GetTemplate describes one template as the caller of ctx sees it.
func (s *Templates) GetTemplate(ctx context.Context, name string) (api.Template, error) {
	ts, err := s.tm.List(ctx)
	if err != nil {
		return api.Template{}, err
	}
	p := tenant.From(ctx)
	for _, q := range p.Lookup(name, true) {
		for _, t := range ts {
			if t.Name == q {
				t.Tenant, _ = tenant.Split(q)
				t.Name = p.Visible(q)
				return t, nil
			}
		}
	}
	return api.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
}

// BuildTemplate builds (or finds cached) a template, reporting progress. A
// tenant's spec is stored in its own namespace and its base resolves like
// any template name it uses (its own first, then the catalogue); copy
// steps read the daemon host's files and are the admin's only.
func (s *Templates) BuildTemplate(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (api.Template, error) {
	p := tenant.From(ctx)
	name := req.Name
	if req.Spec != nil {
		name = req.Spec.Name
	}
	if !p.IsAdmin() {
		if req.Spec != nil {
			spec := *req.Spec
			for _, st := range spec.Steps {
				if st.Copy != nil {
					return api.Template{}, fmt.Errorf("template %s: copy steps read the daemon host's files and are for the admin tenant only: %w", name, errdefs.ErrPermissionDenied)
				}
			}
			spec.Name = tenant.Qualify(p.Tenant, spec.Name)
			if _, err := templates.BuiltinBase(spec.Base); err != nil {
				// A template name: the tenant's own when it has one.
				if _, err := s.tm.Get(ctx, tenant.Qualify(p.Tenant, spec.Base)); err == nil {
					spec.Base = tenant.Qualify(p.Tenant, spec.Base)
				}
			}
			req.Spec = &spec
			req.Name = ""
		} else if _, ok := templates.BuiltinSpec(req.Name); !ok {
			req.Name = tenant.Qualify(p.Tenant, req.Name)
		}
	}
	if _, err := s.tm.Build(ctx, req, progress); err != nil {
		return api.Template{}, err
	}
	return s.GetTemplate(ctx, name)
}
