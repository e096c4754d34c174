package runsecrets

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// TenantSecrets is a SecretStore whose names are the caller's own: every
// method qualifies names with the tenant of ctx (tenant.Qualify), so a
// tenant's secrets live in a namespace of their own and another tenant's
// are not found. The admin sees and names every secret as stored.
type TenantSecrets struct{ Store SecretStore }

var _ SecretStore = TenantSecrets{}

func secretNotFound(name string) error {
	return fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
}

// Put implements SecretStore.
func (s TenantSecrets) Put(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	p := tenant.From(ctx)
	info, err := s.Store.Put(ctx, tenant.Qualify(p.Tenant, name), value)
	if err != nil {
		return api.SecretInfo{}, err
	}
	info.Tenant, _ = tenant.Split(info.Name)
	info.Name = p.Visible(info.Name)
	return info, nil
}

// Secret implements SecretStore.
func (s TenantSecrets) Secret(ctx context.Context, name string) ([]byte, error) {
	v, err := s.Store.Secret(ctx, tenant.Qualify(tenant.From(ctx).Tenant, name))
	if errdefs.IsNotFound(err) {
		return nil, secretNotFound(name)
	}
	return v, err
}

// List implements SecretStore: the caller's secrets (every one for the
// admin).
func (s TenantSecrets) List(ctx context.Context) ([]api.SecretInfo, error) {
	all, err := s.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	p := tenant.From(ctx)
	out := make([]api.SecretInfo, 0, len(all))
	for _, info := range all {
		owner, _ := tenant.Split(info.Name)
		if !p.Sees(owner) {
			continue
		}
		info.Tenant = owner
		info.Name = p.Visible(info.Name)
		out = append(out, info)
	}
	return out, nil
}

// Delete implements SecretStore.
func (s TenantSecrets) Delete(ctx context.Context, name string) error {
	err := s.Store.Delete(ctx, tenant.Qualify(tenant.From(ctx).Tenant, name))
	if errdefs.IsNotFound(err) {
		return secretNotFound(name)
	}
	return err
}
