// Package tenantstore is the persistence contract of the tenant registry
// (internal/tenant): the records it keeps and the interface a metadata
// store implements for it (internal/store.Bolt). It is a leaf, so the
// registry, and the HTTP edge that authenticates through it, never depend
// on the store's implementation.
package tenantstore

import (
	"context"

	"github.com/agentbox/agentbox/api"
)

// TenantStore persists tenants and API keys. It has the same guarantees as
// store.Store (safe for concurrent use, atomic and durable writes, errdefs
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
