package store

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
)

var (
	bucketTenants = []byte("tenants")
	bucketAPIKeys = []byte("apikeys")
)

// TenantStore persists tenants and API keys. It has the same guarantees as
// Store (safe for concurrent use, atomic and durable writes, errdefs
// categories).
type TenantStore interface {
	// PutTenant inserts or replaces the tenant t.ID.
	PutTenant(ctx context.Context, t api.Tenant) error
	// ListTenants returns every decodable tenant ordered by id.
	ListTenants(ctx context.Context) ([]api.Tenant, error)
	// DeleteTenant removes tenant id; a missing one is no error.
	DeleteTenant(ctx context.Context, id string) error
	// PutAPIKey inserts or replaces the key rec.Key.ID.
	PutAPIKey(ctx context.Context, rec APIKeyRecord) error
	// ListAPIKeys returns every decodable key record ordered by id.
	ListAPIKeys(ctx context.Context) ([]APIKeyRecord, error)
}

// APIKeyRecord is a stored API key: its description and the SHA-256 of its
// secret part (the key itself is never stored).
type APIKeyRecord struct {
	Key api.APIKey `json:"key"`
	// Hash is the hex SHA-256 of the whole key string.
	Hash string `json:"hash"`
}

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
