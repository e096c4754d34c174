package agentbox

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Tenants and API keys. A client on the daemon's unix socket is the admin
// tenant (api.AdminTenant) and may manage every tenant and key; a client
// with an API key acts for that key's tenant only. Going over a tenant's
// quota fails a request with IsResourceExhausted(err), and
// (*APIError).RetryAfter says when to try again.

// Tenants lists every tenant, ordered by id, without usage. Admin only:
// other callers get IsPermissionDenied(err).
func (c *Client) Tenants(ctx context.Context) ([]api.Tenant, error) {
	var list api.TenantList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/tenants"}, &list); err != nil {
		return nil, wrapf(err, "listing tenants")
	}
	return list.Tenants, nil
}

// CreateTenant creates a tenant with the given id and quotas (a zero quota
// is unlimited). Admin only; IsAlreadyExists(err) when the id is taken,
// IsInvalidArgument(err) for a malformed id or a negative quota.
func (c *Client) CreateTenant(ctx context.Context, req api.CreateTenantRequest) (api.Tenant, error) {
	var t api.Tenant
	if err := c.call(ctx, request{method: http.MethodPost, path: "/tenants", json: req}, &t); err != nil {
		return api.Tenant{}, wrapf(err, "creating tenant %s", req.ID)
	}
	return t, nil
}

// Tenant returns tenant id with its current quota usage (Tenant.Usage). The
// admin may read any tenant, others only their own: another tenant's id is
// IsNotFound(err), like an unknown one.
func (c *Client) Tenant(ctx context.Context, id string) (api.Tenant, error) {
	var t api.Tenant
	if err := c.call(ctx, request{method: http.MethodGet, path: "/tenants/" + url.PathEscape(id)}, &t); err != nil {
		return api.Tenant{}, wrapf(err, "getting tenant %s", id)
	}
	return t, nil
}

// UpdateTenant replaces tenant id's quotas with q as a whole: a field left
// zero becomes unlimited. To change one quota, read the tenant first and
// send its quotas with that field changed. Admin only.
func (c *Client) UpdateTenant(ctx context.Context, id string, q api.Quotas) (api.Tenant, error) {
	var t api.Tenant
	r := request{method: http.MethodPatch, path: "/tenants/" + url.PathEscape(id), json: api.UpdateTenantRequest{Quotas: q}}
	if err := c.call(ctx, r, &t); err != nil {
		return api.Tenant{}, wrapf(err, "updating tenant %s", id)
	}
	return t, nil
}

// DeleteTenant deletes tenant id and revokes its API keys. Admin only;
// IsConflict(err) while the tenant still owns a sandbox.
func (c *Client) DeleteTenant(ctx context.Context, id string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/tenants/" + url.PathEscape(id)}, nil); err != nil {
		return wrapf(err, "deleting tenant %s", id)
	}
	return nil
}

// CreateAPIKey creates an API key. req.Tenant defaults to the caller's own
// tenant (only the admin may name another), req.Scope to api.ScopeFull. The
// returned CreatedAPIKey.Key is the only copy of the key: the daemon keeps
// just its hash.
func (c *Client) CreateAPIKey(ctx context.Context, req api.CreateAPIKeyRequest) (api.CreatedAPIKey, error) {
	var k api.CreatedAPIKey
	if err := c.call(ctx, request{method: http.MethodPost, path: "/keys", json: req}, &k); err != nil {
		return api.CreatedAPIKey{}, wrapf(err, "creating API key")
	}
	return k, nil
}

// APIKeys lists the caller's tenant's API keys (every tenant's for the
// admin), revoked ones included, oldest first. The keys themselves are never
// returned.
func (c *Client) APIKeys(ctx context.Context) ([]api.APIKey, error) {
	var list api.APIKeyList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/keys"}, &list); err != nil {
		return nil, wrapf(err, "listing API keys")
	}
	return list.Keys, nil
}

// RevokeAPIKey revokes the API key with public id id (APIKey.ID); requests
// made with it, open streams included, end within a second. A tenant may
// revoke only its own keys: another tenant's is IsNotFound(err).
func (c *Client) RevokeAPIKey(ctx context.Context, id string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/keys/" + url.PathEscape(id)}, nil); err != nil {
		return wrapf(err, "revoking API key %s", id)
	}
	return nil
}
