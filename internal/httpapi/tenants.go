package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Authenticator resolves tenants' API keys (internal/tenant/registry.Registry).
// Both methods are safe for concurrent use.
type Authenticator interface {
	// Authenticate returns the principal of key, or an error wrapping
	// errdefs.ErrUnauthenticated.
	Authenticate(key string) (tenant.Principal, error)
	// Track returns a context that is cancelled when p's key is revoked;
	// done is called when the request ends.
	Track(ctx context.Context, p tenant.Principal) (_ context.Context, done func())
}

// TenantService is implemented by a Service with tenants and API keys;
// /v1/tenants and /v1/keys exist only then. The contract of Service
// applies; the caller is tenant.From(ctx).
type TenantService interface {
	CreateTenant(ctx context.Context, req api.CreateTenantRequest) (api.Tenant, error)
	ListTenants(ctx context.Context) ([]api.Tenant, error)
	// GetTenant returns a tenant with its quota usage; a tenant the caller
	// may not see is ErrNotFound.
	GetTenant(ctx context.Context, id string) (api.Tenant, error)
	UpdateTenant(ctx context.Context, id string, q api.Quotas) (api.Tenant, error)
	// DeleteTenant deletes a tenant that owns no sandbox (ErrConflict
	// otherwise) and revokes its keys.
	DeleteTenant(ctx context.Context, id string) error
	CreateAPIKey(ctx context.Context, req api.CreateAPIKeyRequest) (api.CreatedAPIKey, error)
	ListAPIKeys(ctx context.Context) ([]api.APIKey, error)
	// RevokeAPIKey revokes a key and ends the requests in flight with it.
	RevokeAPIKey(ctx context.Context, id string) error
}

var (
	tenantIDRe = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,31}$`)
	keyIDRe    = lazyregexp.New(`^[a-z0-9]{16}$`)
)

// adminOnly are the routes only the admin tenant may call (403 for every
// other caller, whatever the ids in the path): daemon-wide operations.
var adminOnly = map[string]bool{
	"GET /v1/tenants":               true,
	"POST /v1/tenants":              true,
	"PATCH /v1/tenants/{tenant}":    true,
	"DELETE /v1/tenants/{tenant}":   true,
	"GET /v1/admin/quarantine":      true,
	"GET /v1/pools":                 true,
	"PUT /v1/templates/{name}/pool": true,
	"POST /v1/gc":                   true,
	"POST /v1/runners":              true,
	"GET /metrics":                  true,
}

// authorize applies the caller's scope and the admin-only routes to the
// route pattern r matched.
func authorize(p tenant.Principal, r *http.Request, pattern string) error {
	if adminOnly[pattern] && !p.IsAdmin() {
		return fmt.Errorf("%s %s is for the admin tenant only: %w", r.Method, r.URL.Path, errdefs.ErrPermissionDenied)
	}
	if !p.CanWrite() && r.Method != http.MethodGet && r.Method != http.MethodHead {
		return fmt.Errorf("this API key is read-only: %w", errdefs.ErrPermissionDenied)
	}
	return nil
}

func (h *handler) tenantRoutes() []route {
	ts, ok := h.svc.(TenantService)
	if !ok {
		return nil
	}
	tenantID := func(r *http.Request) (string, error) {
		id := r.PathValue("tenant")
		if !tenantIDRe.MatchString(id) {
			return "", errorf("invalid tenant id %q: want ^[a-z0-9][a-z0-9-]{0,31}$", clip(id))
		}
		return id, nil
	}
	return []route{
		{"GET", "/v1/tenants", listAll(ts.ListTenants, func(l []api.Tenant) api.TenantList { return api.TenantList{Tenants: l} })},
		{"POST", "/v1/tenants", func(w http.ResponseWriter, r *http.Request) error {
			var req api.CreateTenantRequest
			if err := h.decodeJSON(w, r, &req, false); err != nil {
				return err
			}
			t, err := ts.CreateTenant(r.Context(), req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, t)
			return nil
		}},
		{"GET", "/v1/tenants/{tenant}", func(w http.ResponseWriter, r *http.Request) error {
			id, err := tenantID(r)
			if err != nil {
				return err
			}
			t, err := ts.GetTenant(r.Context(), id)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, t)
			return nil
		}},
		{"PATCH", "/v1/tenants/{tenant}", withBody(h, tenantID, http.StatusOK, func(ctx context.Context, id string, req api.UpdateTenantRequest) (api.Tenant, error) {
			return ts.UpdateTenant(ctx, id, req.Quotas)
		})},
		{"DELETE", "/v1/tenants/{tenant}", func(w http.ResponseWriter, r *http.Request) error {
			id, err := tenantID(r)
			if err != nil {
				return err
			}
			if err := ts.DeleteTenant(r.Context(), id); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
		{"GET", "/v1/keys", listAll(ts.ListAPIKeys, func(l []api.APIKey) api.APIKeyList { return api.APIKeyList{Keys: l} })},
		{"POST", "/v1/keys", func(w http.ResponseWriter, r *http.Request) error {
			var req api.CreateAPIKeyRequest
			if err := h.decodeJSON(w, r, &req, true); err != nil {
				return err
			}
			if req.Tenant != "" && !tenantIDRe.MatchString(req.Tenant) {
				return errorf("invalid tenant id %q", clip(req.Tenant))
			}
			k, err := ts.CreateAPIKey(r.Context(), req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, k)
			return nil
		}},
		{"DELETE", "/v1/keys/{key}", func(w http.ResponseWriter, r *http.Request) error {
			id := r.PathValue("key")
			if !keyIDRe.MatchString(id) {
				return errorf("invalid key id %q: want 16 characters of [a-z0-9]", clip(id))
			}
			if err := ts.RevokeAPIKey(r.Context(), id); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}
