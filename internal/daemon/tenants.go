package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/layergc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/tenant/registry"
)

// tenantAPI is the tenant registry as the HTTP edge sees it
// (httpapi.TenantService); the registry also authenticates TCP callers
// and admits sandboxes and runs against quotas.
type tenantAPI struct {
	reg  *registry.Registry
	mgr  *sandbox.Manager
	pipe *pipelineAPI
}

var _ httpapi.TenantService = service{}

// connectTenants connects the registry's quota meters: the Manager
// counts sandboxes and disk (their limits), the layer collector the
// layers of checkpoints and templates, the pipeline's run records meter CPU. The registry is
// the Manager's quota admission from its construction (sandbox.Config);
// this runs before anything is started.
func connectTenants(reg *registry.Registry, mgr *sandbox.Manager, layerGC *layergc.Collector, pipe *pipelineAPI) *tenantAPI {
	reg.SetMeters(registry.Meters{
		Holdings: mgr.Holdings,
		Layers:   layerGC.LayerBytes,
		CPUSeconds: func(ctx context.Context, t string, since time.Time) (float64, error) {
			runs, err := pipe.p.List(tenant.WithPrincipal(ctx, tenant.Admin), store.RunFilter{Tenant: t, Since: since})
			if err != nil {
				return 0, err
			}
			var sum float64
			for _, r := range runs {
				sum += r.Usage.CPUSeconds
			}
			return sum, nil
		},
	})
	return &tenantAPI{reg: reg, mgr: mgr, pipe: pipe}
}

// CreateTenant implements httpapi.TenantService.
func (x *tenantAPI) CreateTenant(ctx context.Context, req api.CreateTenantRequest) (api.Tenant, error) {
	return x.reg.CreateTenant(ctx, req)
}

// ListTenants implements httpapi.TenantService.
func (x *tenantAPI) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	return x.reg.Tenants(tenant.From(ctx)), nil
}

// GetTenant implements httpapi.TenantService: the tenant with what counts
// against its quotas now.
func (x *tenantAPI) GetTenant(ctx context.Context, id string) (api.Tenant, error) {
	t, err := x.reg.Tenant(tenant.From(ctx), id)
	if err != nil {
		return api.Tenant{}, err
	}
	u, err := x.reg.Usage(ctx, t)
	if err != nil {
		return api.Tenant{}, err
	}
	t.Usage = &u
	return t, nil
}

// UpdateTenant implements httpapi.TenantService.
func (x *tenantAPI) UpdateTenant(ctx context.Context, id string, q api.Quotas) (api.Tenant, error) {
	return x.reg.UpdateTenant(ctx, id, q)
}

// DeleteTenant implements httpapi.TenantService. A tenant that still
// owns sandboxes is not deleted (ErrConflict): its sandboxes are deleted
// first, by the admin or the tenant. Otherwise everything it owns goes
// with it, in this order: its schedules and webhooks (nothing starts runs
// in its name any more), its keys (revoked; requests in flight end), its
// checkpoints, templates and secrets, its run records, and the tenant.
// A new tenant of the same name starts with nothing. A delete that fails
// part-way leaves the tenant (keys revoked) and can be repeated.
func (x *tenantAPI) DeleteTenant(ctx context.Context, id string) error {
	if !x.reg.Exists(id) || id == api.AdminTenant {
		return fmt.Errorf("tenant %s: %w", id, errdefs.ErrNotFound)
	}
	if n, _ := x.mgr.Holdings(id); n > 0 {
		return fmt.Errorf("tenant %s owns %d sandboxes; delete them first: %w", id, n, errdefs.ErrConflict)
	}
	ctx = context.WithoutCancel(ctx)
	as := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: id, Scope: api.ScopeFull})
	if err := x.pipe.deleteTriggers(as); err != nil {
		return fmt.Errorf("deleting tenant %s: %w", id, err)
	}
	if err := x.reg.RevokeTenantKeys(ctx, id); err != nil {
		return fmt.Errorf("deleting tenant %s: %w", id, err)
	}
	// Sandboxes created by a request that was in flight until now.
	if err := x.mgr.PurgeTenant(ctx, id); err != nil {
		return fmt.Errorf("deleting tenant %s: %w", id, err)
	}
	if err := x.pipe.p.ForgetTenant(ctx, id); err != nil {
		return fmt.Errorf("deleting tenant %s: %w", id, err)
	}
	return x.reg.DeleteTenant(ctx, id)
}

// CreateAPIKey implements httpapi.TenantService.
func (x *tenantAPI) CreateAPIKey(ctx context.Context, req api.CreateAPIKeyRequest) (api.CreatedAPIKey, error) {
	return x.reg.CreateKey(ctx, tenant.From(ctx), req)
}

// ListAPIKeys implements httpapi.TenantService.
func (x *tenantAPI) ListAPIKeys(ctx context.Context) ([]api.APIKey, error) {
	return x.reg.Keys(tenant.From(ctx)), nil
}

// RevokeAPIKey implements httpapi.TenantService.
func (x *tenantAPI) RevokeAPIKey(ctx context.Context, id string) error {
	return x.reg.RevokeKey(ctx, tenant.From(ctx), id)
}
