package store

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/tenantstore"
)

var (
	bucketTenants = []byte("tenants")
	bucketAPIKeys = []byte("apikeys")
)

// TenantStore persists tenants and API keys (package tenantstore, the
// registry's contract).
type TenantStore = tenantstore.TenantStore

// APIKeyRecord is a stored API key (package tenantstore).
type APIKeyRecord = tenantstore.APIKeyRecord

var _ TenantStore = (*Bolt)(nil)

// PutTenant implements TenantStore.
func (b *Bolt) PutTenant(ctx context.Context, t api.Tenant) error {
	t.Usage = nil
	if err := b.putJSON(ctx, bucketTenants, t.ID, t); err != nil {
		return fmt.Errorf("storing tenant %s: %w", t.ID, err)
	}
	return nil
}

// ListTenants implements TenantStore.
func (b *Bolt) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	ts, err := listJSON[api.Tenant](ctx, b, bucketTenants)
	if err != nil {
		return nil, fmt.Errorf("listing tenants: %w", err)
	}
	return ts, nil
}

// DeleteTenant implements TenantStore.
func (b *Bolt) DeleteTenant(ctx context.Context, id string) error {
	if err := b.deleteKey(ctx, bucketTenants, id); err != nil {
		return fmt.Errorf("deleting tenant %s: %w", id, err)
	}
	return nil
}

// PutAPIKey implements TenantStore.
func (b *Bolt) PutAPIKey(ctx context.Context, rec APIKeyRecord) error {
	if err := b.putJSON(ctx, bucketAPIKeys, rec.Key.ID, rec); err != nil {
		return fmt.Errorf("storing API key %s: %w", rec.Key.ID, err)
	}
	return nil
}

// ListAPIKeys implements TenantStore.
func (b *Bolt) ListAPIKeys(ctx context.Context) ([]APIKeyRecord, error) {
	ks, err := listJSON[APIKeyRecord](ctx, b, bucketAPIKeys)
	if err != nil {
		return nil, fmt.Errorf("listing API keys: %w", err)
	}
	return ks, nil
}
