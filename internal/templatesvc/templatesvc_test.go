package templatesvc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/templatesvc"
	"github.com/agentbox/agentbox/internal/tenant"
)

func service(t *testing.T) (*sandboxtest.Env, *templatesvc.Templates) {
	t.Helper()
	h := sandboxtest.New(t)
	return h, templatesvc.New(templatesvc.Config{Templates: h.Templates, Layers: h.Layers, Sandboxes: h.M})
}

// A tenant sees the catalogue and its own templates, not another
// tenant's; what reads the daemon host's files is the admin's only.
func TestTenantViewAndAdminOnly(t *testing.T) {
	h, s := service(t)
	ctx := sandboxtest.Context(t)
	acme := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "acme", Scope: api.ScopeFull})
	other := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "other", Scope: api.ScopeFull})

	if tp, err := s.GetTemplate(acme, "base"); err != nil || tp.Tenant != api.AdminTenant {
		t.Fatalf("catalogue template as a tenant: %+v, %v", tp, err)
	}
	sb, err := h.M.CreateSandbox(acme, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.SaveTemplate(acme, sb.ID, api.SaveTemplateRequest{Name: "mine"})
	if err != nil || v.Name != "mine" || v.Version != 1 {
		t.Fatalf("SaveTemplate = %+v, %v", v, err)
	}
	names := func(ctx context.Context) map[string]bool {
		ts, err := s.ListTemplates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, tp := range ts {
			m[tp.Name] = true
		}
		return m
	}
	if got := names(acme); !got["mine"] || !got["base"] {
		t.Errorf("acme lists %v, want its own and the catalogue's", got)
	}
	if got := names(other); got["mine"] || !got["base"] {
		t.Errorf("another tenant lists %v", got)
	}
	if got := names(ctx); !got["acme~mine"] {
		t.Errorf("the admin lists %v, want acme~mine", got)
	}
	if _, err := s.TemplateVersions(other, "mine"); !errdefs.IsNotFound(err) {
		t.Errorf("another tenant's versions: %v", err)
	}

	spec := &api.TemplateSpec{Name: "copied", Base: "base", Steps: []api.TemplateStep{{Copy: &api.CopyStep{Src: "/etc/hostname", Dst: "/x"}}}}
	if _, err := s.BuildTemplate(acme, api.BuildTemplateRequest{Spec: spec}, func(api.BuildEvent) {}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant's copy step: %v, want ErrPermissionDenied", err)
	}
	if _, err := s.ImportTemplatePath(acme, "img", "/tmp/img"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant's import from a host path: %v, want ErrPermissionDenied", err)
	}
	if _, err := s.ImportTemplatePath(ctx, "img", "relative"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("import from a relative path: %v, want ErrInvalidArgument", err)
	}
	if _, err := s.ExportTemplate(other, "mine"); !errdefs.IsNotFound(err) {
		t.Errorf("export of another tenant's template: %v", err)
	}
}

// Without a layer store imports, exports and saves are refused.
func TestNoLayerStore(t *testing.T) {
	h, _ := service(t)
	s := templatesvc.New(templatesvc.Config{Templates: h.Templates, Sandboxes: h.M})
	ctx := sandboxtest.Context(t)
	if _, err := s.SaveTemplate(ctx, "sb", api.SaveTemplateRequest{Name: "x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("save: %v", err)
	}
	if _, err := s.ExportTemplate(ctx, "base"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("export: %v", err)
	}
}
