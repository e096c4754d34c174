package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/tenant/registry"
)

func (f *fakeService) CreateTenant(ctx context.Context, req api.CreateTenantRequest) (api.Tenant, error) {
	return api.Tenant{ID: req.ID, Quotas: req.Quotas}, f.call("CreateTenant", tenant.From(ctx), req)
}
func (f *fakeService) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	return []api.Tenant{{ID: "t1"}}, f.call("ListTenants", tenant.From(ctx))
}
func (f *fakeService) GetTenant(ctx context.Context, id string) (api.Tenant, error) {
	return api.Tenant{ID: id}, f.call("GetTenant", tenant.From(ctx), id)
}
func (f *fakeService) UpdateTenant(ctx context.Context, id string, q api.Quotas) (api.Tenant, error) {
	return api.Tenant{ID: id, Quotas: q}, f.call("UpdateTenant", tenant.From(ctx), id, q)
}
func (f *fakeService) DeleteTenant(ctx context.Context, id string) error {
	return f.call("DeleteTenant", tenant.From(ctx), id)
}
func (f *fakeService) CreateAPIKey(ctx context.Context, req api.CreateAPIKeyRequest) (api.CreatedAPIKey, error) {
	return api.CreatedAPIKey{Key: "abx_x"}, f.call("CreateAPIKey", tenant.From(ctx), req)
}
func (f *fakeService) ListAPIKeys(ctx context.Context) ([]api.APIKey, error) {
	return nil, f.call("ListAPIKeys", tenant.From(ctx))
}
func (f *fakeService) RevokeAPIKey(ctx context.Context, id string) error {
	return f.call("RevokeAPIKey", tenant.From(ctx), id)
}

var _ TenantService = (*fakeService)(nil)

// newRegistry returns a registry with tenants "t1" and "t2" and keys
// (full and read) for t1.
func newRegistry(t *testing.T) (reg *registry.Registry, full, read api.CreatedAPIKey) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	reg, err = registry.Open(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t1", "t2"} {
		if _, err := reg.CreateTenant(ctx, api.CreateTenantRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if full, err = reg.CreateKey(ctx, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "t1"}); err != nil {
		t.Fatal(err)
	}
	if read, err = reg.CreateKey(ctx, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "t1", Scope: api.ScopeRead}); err != nil {
		t.Fatal(err)
	}
	return reg, full, read
}

func TestTenantPrincipalReachesService(t *testing.T) {
	reg, full, _ := newRegistry(t)
	f := &fakeService{}
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, Tenants: reg, APIKeys: []string{"admin-key-0123456789"}})
	if rec := do(h, "GET", "/v1/tenants/t1", "", "Authorization", "Bearer "+full.Key); rec.Code != 200 {
		t.Fatalf("GET own tenant: %d %s", rec.Code, rec.Body)
	}
	_, args := f.lastCall()
	if p := args[0].(tenant.Principal); p.Tenant != "t1" || p.KeyID != full.ID || p.Scope != api.ScopeFull {
		t.Fatalf("principal %+v", p)
	}
	// A key of the keys file is the admin tenant.
	if rec := do(h, "GET", "/v1/tenants", "", "Authorization", "Bearer admin-key-0123456789"); rec.Code != 200 {
		t.Fatalf("admin key: %d %s", rec.Code, rec.Body)
	}
	if _, args := f.lastCall(); !args[0].(tenant.Principal).IsAdmin() {
		t.Fatalf("keys-file key is not admin: %+v", args[0])
	}
	// The unix socket is the admin tenant.
	hu, _ := newTestHandler(t, f, Options{Tenants: reg})
	if rec := do(hu, "GET", "/v1/tenants", ""); rec.Code != 200 {
		t.Fatalf("unix: %d", rec.Code)
	}
	if _, args := f.lastCall(); !args[0].(tenant.Principal).IsAdmin() {
		t.Fatalf("unix socket is not admin: %+v", args[0])
	}
}

func TestTenantScopesAndAdminRoutes(t *testing.T) {
	reg, full, read := newRegistry(t)
	f := &fakeService{}
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, Tenants: reg})
	auth := func(k api.CreatedAPIKey) []string { return []string{"Authorization", "Bearer " + k.Key} }
	// Admin-only routes: 403 for a tenant, whatever the ids, and the
	// service is never called.
	for _, c := range []struct{ method, target, body string }{
		{"GET", "/v1/tenants", ""},
		{"POST", "/v1/tenants", `{"id":"x"}`},
		{"PATCH", "/v1/tenants/t1", `{"quotas":{}}`},
		{"DELETE", "/v1/tenants/t2", ""},
		{"POST", "/v1/gc", `{}`},
		{"GET", "/v1/admin/quarantine", ""},
	} {
		f.calls = nil
		rec := do(h, c.method, c.target, c.body, auth(full)...)
		if rec.Code != 403 || decodeError(t, rec).Code != "permission_denied" {
			t.Errorf("%s %s as tenant: %d %s", c.method, c.target, rec.Code, rec.Body)
		}
		if name, _ := f.lastCall(); name != "" {
			t.Errorf("%s %s: service called (%s)", c.method, c.target, name)
		}
	}
	// A read-only key reads but never writes.
	if rec := do(h, "GET", "/v1/sandboxes", "", auth(read)...); rec.Code != 200 {
		t.Fatalf("read key GET: %d %s", rec.Code, rec.Body)
	}
	for _, c := range []struct{ method, target, body string }{
		{"POST", "/v1/sandboxes", `{}`},
		{"DELETE", "/v1/sandboxes/abc", ""},
		{"POST", "/v1/sandboxes/abc/exec", `{"cmd":["true"]}`},
		{"PUT", "/v1/sandboxes/abc/files?path=/a", "x"},
		{"POST", "/v1/keys", `{}`},
		{"DELETE", "/v1/keys/" + full.ID, ""},
	} {
		f.calls = nil
		if rec := do(h, c.method, c.target, c.body, auth(read)...); rec.Code != 403 {
			t.Errorf("read key %s %s: %d %s", c.method, c.target, rec.Code, rec.Body)
		}
		if name, _ := f.lastCall(); name != "" {
			t.Errorf("read key %s %s: service called (%s)", c.method, c.target, name)
		}
	}
	// Revoked keys are refused like unknown ones.
	if err := reg.RevokeKey(context.Background(), tenant.Admin, read.ID); err != nil {
		t.Fatal(err)
	}
	rec := do(h, "GET", "/v1/sandboxes", "", auth(read)...)
	unknown := do(h, "GET", "/v1/sandboxes", "", "Authorization", "Bearer abx_0123456789abcdef_"+strings.Repeat("0", 64))
	if rec.Code != 401 || unknown.Code != 401 || decodeError(t, rec).Message != decodeError(t, unknown).Message {
		t.Fatalf("revoked %d %s, unknown %d %s", rec.Code, rec.Body, unknown.Code, unknown.Body)
	}
}

func TestRetryAfterOnQuota(t *testing.T) {
	f := &fakeService{err: errdefs.WithRetryAfter(fmt.Errorf("over quota: %w", errdefs.ErrResourceExhausted), 1500*time.Millisecond)}
	h, _ := newTestHandler(t, f, Options{})
	rec := do(h, "POST", "/v1/sandboxes", `{}`)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "2" {
		t.Fatalf("%d Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if e := decodeError(t, rec); e.Code != "resource_exhausted" || !strings.Contains(e.Message, "over quota") {
		t.Fatalf("%+v", e)
	}
}

// Revoking a key ends an exec stream that is open with it.
func TestRevokeEndsOpenStream(t *testing.T) {
	reg, full, _ := newRegistry(t)
	f := &fakeService{stream: newFakeStream()}
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, Tenants: reg})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes/abc/exec", strings.NewReader(`{"cmd":["sleep","1000"]}`))
	req.Header.Set("Authorization", "Bearer "+full.Key)
	f.stream.events <- api.ExecEvent{Type: api.EventStarted, Pid: 7}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "started") {
		t.Fatalf("first event %q %v", line, err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				ended <- err
				return
			}
		}
	}()
	start := time.Now()
	if err := reg.RevokeKey(context.Background(), tenant.Admin, full.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
		t.Logf("stream ended %v after the revocation", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open 10s after its key was revoked")
	}
	select {
	case <-f.stream.closed:
	default:
		t.Fatal("the service's stream was not closed")
	}
}
