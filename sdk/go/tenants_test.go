package agentbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// reply is a scripted response: status, JSON body (nil for none) and
// headers.
type reply struct {
	status int
	body   any
	header http.Header
}

// seen is one request a scriptedServer received.
type seen struct {
	method, path, body string
}

// scriptedServer answers "METHOD /escaped/path" with its reply (404 JSON for
// anything else) and records every request.
type scriptedServer struct {
	*httptest.Server
	mu   sync.Mutex // guards reqs
	reqs []seen
}

func newScriptedServer(t *testing.T, replies map[string]reply) *scriptedServer {
	t.Helper()
	s := &scriptedServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, seen{r.Method, r.URL.EscapedPath(), string(b)})
		s.mu.Unlock()
		rep, ok := replies[r.Method+" "+r.URL.EscapedPath()]
		if !ok {
			rep = reply{status: http.StatusNotFound, body: api.Error{Code: "not_found", Message: "no such thing", RequestID: "req-1"}}
		}
		for k, vs := range rep.header {
			w.Header()[k] = vs
		}
		if rep.body == nil {
			w.WriteHeader(rep.status)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.status)
		_ = json.NewEncoder(w).Encode(rep.body)
	}))
	t.Cleanup(s.Close)
	return s
}

// last returns the last request received.
func (s *scriptedServer) last(t *testing.T) seen {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		t.Fatal("the server received no request")
	}
	return s.reqs[len(s.reqs)-1]
}

// jsonEqual reports whether JSON text got encodes the same value as want.
func jsonEqual(t *testing.T, got string, want any) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("request body %q: %v", got, err)
	}
	b, _ := json.Marshal(want)
	_ = json.Unmarshal(b, &w)
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	return string(gb) == string(wb)
}

func TestTenants(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	acme := api.Tenant{ID: "acme", Quotas: api.Quotas{MaxSandboxes: 5, CPUSeconds: 600, PeriodSeconds: 3600, DiskBytes: 10 << 30}, CreatedAt: created}
	withUsage := acme
	withUsage.Usage = &api.TenantQuotaUsage{Sandboxes: 2, CPUSeconds: 12.5, DiskBytes: 1 << 20}
	updated := acme
	updated.Quotas.MaxSandboxes = 9
	srv := newScriptedServer(t, map[string]reply{
		"GET /v1/tenants":             {status: 200, body: api.TenantList{Tenants: []api.Tenant{acme}}},
		"POST /v1/tenants":            {status: 201, body: acme},
		"GET /v1/tenants/acme":        {status: 200, body: withUsage},
		"PATCH /v1/tenants/acme":      {status: 200, body: updated},
		"DELETE /v1/tenants/acme":     {status: 204},
		"DELETE /v1/tenants/a%2Fb%3F": {status: 204},
	})
	c := newClient(t, srv.URL)
	ctx := context.Background()

	list, err := c.Tenants(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "acme" || list[0].Quotas != acme.Quotas || !list[0].CreatedAt.Equal(created) {
		t.Fatalf("Tenants = %+v, %v", list, err)
	}
	if r := srv.last(t); r.method != "GET" || r.path != "/v1/tenants" || r.body != "" {
		t.Fatalf("Tenants sent %+v", r)
	}

	req := api.CreateTenantRequest{ID: "acme", Quotas: acme.Quotas}
	got, err := c.CreateTenant(ctx, req)
	if err != nil || got.ID != "acme" || got.Quotas != acme.Quotas {
		t.Fatalf("CreateTenant = %+v, %v", got, err)
	}
	r := srv.last(t)
	if r.method != "POST" || r.path != "/v1/tenants" ||
		!jsonEqual(t, r.body, map[string]any{"id": "acme", "quotas": map[string]any{
			"max_sandboxes": 5, "cpu_seconds": 600, "period_seconds": 3600, "disk_bytes": 10 << 30}}) {
		t.Fatalf("CreateTenant sent %+v", r)
	}

	got, err = c.Tenant(ctx, "acme")
	if err != nil || got.Usage == nil || got.Usage.Sandboxes != 2 || got.Usage.CPUSeconds != 12.5 || got.Usage.DiskBytes != 1<<20 {
		t.Fatalf("Tenant = %+v, %v", got, err)
	}
	if r := srv.last(t); r.method != "GET" || r.path != "/v1/tenants/acme" {
		t.Fatalf("Tenant sent %+v", r)
	}

	got, err = c.UpdateTenant(ctx, "acme", updated.Quotas)
	if err != nil || got.Quotas.MaxSandboxes != 9 {
		t.Fatalf("UpdateTenant = %+v, %v", got, err)
	}
	r = srv.last(t)
	if r.method != "PATCH" || r.path != "/v1/tenants/acme" ||
		!jsonEqual(t, r.body, api.UpdateTenantRequest{Quotas: updated.Quotas}) {
		t.Fatalf("UpdateTenant sent %+v", r)
	}
	// Unlimited everywhere is an explicit, empty quotas object: PATCH
	// replaces the quotas as a whole.
	if _, err := c.UpdateTenant(ctx, "acme", api.Quotas{}); err != nil {
		t.Fatal(err)
	}
	if r := srv.last(t); r.body != `{"quotas":{}}` {
		t.Fatalf("UpdateTenant to unlimited sent %q", r.body)
	}

	if err := c.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatalf("DeleteTenant: %v", err)
	}
	if r := srv.last(t); r.method != "DELETE" || r.path != "/v1/tenants/acme" {
		t.Fatalf("DeleteTenant sent %+v", r)
	}
	if err := c.DeleteTenant(ctx, "a/b?"); err != nil {
		t.Fatalf("DeleteTenant of an id needing escapes: %v", err)
	}
	if r := srv.last(t); r.path != "/v1/tenants/a%2Fb%3F" {
		t.Fatalf("DeleteTenant did not escape the id: %+v", r)
	}

	_, err = c.Tenant(ctx, "other")
	if !agentbox.IsNotFound(err) || agentbox.RequestID(err) != "req-1" {
		t.Fatalf("Tenant(other) = %v, want not found with request id", err)
	}
	if want := "getting tenant other: no such thing"; err.Error() != want {
		t.Fatalf("error text = %q, want %q", err, want)
	}
}

func TestAPIKeys(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	revoked := created.Add(time.Hour)
	k1 := api.APIKey{ID: "0123456789abcdef", Tenant: "acme", Scope: api.ScopeRead, Name: "ci", CreatedAt: created}
	k2 := api.APIKey{ID: "fedcba9876543210", Tenant: "acme", Scope: api.ScopeFull, CreatedAt: created, RevokedAt: &revoked}
	srv := newScriptedServer(t, map[string]reply{
		"GET /v1/keys":                     {status: 200, body: api.APIKeyList{Keys: []api.APIKey{k1, k2}}},
		"POST /v1/keys":                    {status: 201, body: api.CreatedAPIKey{APIKey: k1, Key: "abx_0123456789abcdef_s3cret"}},
		"DELETE /v1/keys/0123456789abcdef": {status: 204},
	})
	c := newClient(t, srv.URL)
	ctx := context.Background()

	k, err := c.CreateAPIKey(ctx, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead, Name: "ci"})
	if err != nil || k.Key != "abx_0123456789abcdef_s3cret" || k.ID != k1.ID || k.Tenant != "acme" || k.Scope != api.ScopeRead {
		t.Fatalf("CreateAPIKey = %+v, %v", k, err)
	}
	if r := srv.last(t); r.method != "POST" || r.path != "/v1/keys" ||
		!jsonEqual(t, r.body, map[string]string{"tenant": "acme", "scope": "read", "name": "ci"}) {
		t.Fatalf("CreateAPIKey sent %+v", r)
	}
	// Defaults are left to the daemon: nothing is sent for them.
	if _, err := c.CreateAPIKey(ctx, api.CreateAPIKeyRequest{}); err != nil {
		t.Fatal(err)
	}
	if r := srv.last(t); r.body != "{}" {
		t.Fatalf("CreateAPIKey with defaults sent %q", r.body)
	}

	keys, err := c.APIKeys(ctx)
	if err != nil || len(keys) != 2 || keys[0] != k1 || keys[1].RevokedAt == nil || !keys[1].RevokedAt.Equal(revoked) {
		t.Fatalf("APIKeys = %+v, %v", keys, err)
	}
	if r := srv.last(t); r.method != "GET" || r.path != "/v1/keys" {
		t.Fatalf("APIKeys sent %+v", r)
	}

	if err := c.RevokeAPIKey(ctx, k1.ID); err != nil {
		t.Fatalf("RevokeAPIKey: %v", err)
	}
	if r := srv.last(t); r.method != "DELETE" || r.path != "/v1/keys/0123456789abcdef" {
		t.Fatalf("RevokeAPIKey sent %+v", r)
	}
	err = c.RevokeAPIKey(ctx, "nope")
	if !agentbox.IsNotFound(err) || err.Error() != "revoking API key nope: no such thing" {
		t.Fatalf("RevokeAPIKey(nope) = %v", err)
	}
}

func TestQuotaErrorRetryAfter(t *testing.T) {
	soon := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	srv := newScriptedServer(t, map[string]reply{
		"POST /v1/keys": {status: 429, header: http.Header{"Retry-After": {"120"}},
			body: api.Error{Code: "resource_exhausted", Message: "tenant acme is over its quota of 5 sandboxes", RequestID: "req-9"}},
		"GET /v1/keys": {status: 503, header: http.Header{"Retry-After": {soon}},
			body: api.Error{Code: "unavailable", Message: "busy"}},
		"GET /v1/tenants": {status: 403, header: http.Header{"Retry-After": {"5"}},
			body: api.Error{Code: "permission_denied", Message: "admin only"}},
		"DELETE /v1/tenants/acme": {status: 429, header: http.Header{"Retry-After": {"soon"}}},
	})
	c := newClient(t, srv.URL)
	ctx := context.Background()

	_, err := c.CreateAPIKey(ctx, api.CreateAPIKeyRequest{})
	var apiErr *agentbox.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusTooManyRequests || apiErr.Code != agentbox.CodeResourceExhausted ||
		apiErr.RequestID != "req-9" || !agentbox.IsResourceExhausted(err) || apiErr.RetryAfter() != 120*time.Second {
		t.Fatalf("429: %#v (%v)", apiErr, err)
	}

	_, err = c.APIKeys(ctx)
	if !errors.As(err, &apiErr) || !agentbox.IsUnavailable(err) || agentbox.IsResourceExhausted(err) {
		t.Fatalf("503: %v", err)
	}
	if d := apiErr.RetryAfter(); d < 85*time.Second || d > 90*time.Second {
		t.Fatalf("503 with an HTTP-date Retry-After: RetryAfter() = %v, want about 90s", d)
	}

	// Retry-After counts only on 429 and 503.
	_, err = c.Tenants(ctx)
	if !errors.As(err, &apiErr) || !agentbox.IsPermissionDenied(err) || apiErr.RetryAfter() != 0 {
		t.Fatalf("403: %v, RetryAfter %v", err, apiErr.RetryAfter())
	}
	// An unparsable value is no delay; a body-less 429 still has its code.
	err = c.DeleteTenant(ctx, "acme")
	if !errors.As(err, &apiErr) || !agentbox.IsResourceExhausted(err) || apiErr.RetryAfter() != 0 {
		t.Fatalf("429 with Retry-After: soon: %#v (%v)", apiErr, err)
	}
}
