package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

var quietLog = slog.New(slog.DiscardHandler)

// openStore opens a bbolt store in a temporary directory and returns it
// with its path; it is closed when the test ends.
func openStore(t *testing.T) (*store.Bolt, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db")
	st, err := store.Open(path)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st, path
}

func newRegistry(t *testing.T) (*Registry, *store.Bolt) {
	t.Helper()
	st, _ := openStore(t)
	r, err := Open(t.Context(), st, quietLog)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return r, st
}

func mustCreateTenant(t *testing.T, r *Registry, id string, q api.Quotas) api.Tenant {
	t.Helper()
	tn, err := r.CreateTenant(t.Context(), api.CreateTenantRequest{ID: id, Quotas: q})
	if err != nil {
		t.Fatalf("CreateTenant(%s): %v", id, err)
	}
	return tn
}

func mustCreateKey(t *testing.T, r *Registry, p tenant.Principal, req api.CreateAPIKeyRequest) api.CreatedAPIKey {
	t.Helper()
	k, err := r.CreateKey(t.Context(), p, req)
	if err != nil {
		t.Fatalf("CreateKey(%+v, %+v): %v", p, req, err)
	}
	return k
}

func TestCreateTenantValidation(t *testing.T) {
	r, _ := newRegistry(t)
	for _, tc := range []struct {
		name string
		req  api.CreateTenantRequest
		want error
	}{
		{"empty id", api.CreateTenantRequest{}, errdefs.ErrInvalidArgument},
		{"upper case", api.CreateTenantRequest{ID: "Acme"}, errdefs.ErrInvalidArgument},
		{"leading dash", api.CreateTenantRequest{ID: "-acme"}, errdefs.ErrInvalidArgument},
		{"separator", api.CreateTenantRequest{ID: "a~b"}, errdefs.ErrInvalidArgument},
		{"too long", api.CreateTenantRequest{ID: strings.Repeat("x", 33)}, errdefs.ErrInvalidArgument},
		{"reserved admin", api.CreateTenantRequest{ID: api.AdminTenant}, errdefs.ErrAlreadyExists},
		{"negative sandboxes", api.CreateTenantRequest{ID: "n1", Quotas: api.Quotas{MaxSandboxes: -1}}, errdefs.ErrInvalidArgument},
		{"negative cpu", api.CreateTenantRequest{ID: "n2", Quotas: api.Quotas{CPUSeconds: -0.5}}, errdefs.ErrInvalidArgument},
		{"negative period", api.CreateTenantRequest{ID: "n3", Quotas: api.Quotas{PeriodSeconds: -1}}, errdefs.ErrInvalidArgument},
		{"negative disk", api.CreateTenantRequest{ID: "n4", Quotas: api.Quotas{DiskBytes: -1}}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.CreateTenant(t.Context(), tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CreateTenant(%+v) = %v, want %v", tc.req, err, tc.want)
			}
		})
	}
	if got := r.Tenants(tenant.Admin); len(got) != 0 {
		t.Errorf("refused creates left tenants behind: %+v", got)
	}

	q := api.Quotas{MaxSandboxes: 3, CPUSeconds: 60, PeriodSeconds: 600, DiskBytes: 1 << 30}
	before := time.Now().UTC().Truncate(time.Second)
	tn := mustCreateTenant(t, r, "acme", q)
	if tn.ID != "acme" || tn.Quotas != q || tn.Usage != nil {
		t.Errorf("created %+v", tn)
	}
	if tn.CreatedAt.Before(before) || tn.CreatedAt.After(time.Now()) || tn.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt = %v, want a UTC time of now", tn.CreatedAt)
	}
	_, err := r.CreateTenant(t.Context(), api.CreateTenantRequest{ID: "acme"})
	if !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate CreateTenant = %v, want ErrAlreadyExists", err)
	}
	if got, _ := r.Tenant(tenant.Admin, "acme"); got.Quotas != q {
		t.Errorf("a refused duplicate changed the tenant: %+v", got)
	}
}

func TestTenantsVisibility(t *testing.T) {
	r, _ := newRegistry(t)
	for _, id := range []string{"zeta", "acme", "mid"} {
		mustCreateTenant(t, r, id, api.Quotas{})
	}
	var ids []string
	for _, tn := range r.Tenants(tenant.Admin) {
		ids = append(ids, tn.ID)
	}
	if want := []string{"acme", "mid", "zeta"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("admin Tenants = %v, want %v", ids, want)
	}
	acme := tenant.Principal{Tenant: "acme", Scope: api.ScopeRead}
	if got := r.Tenants(acme); len(got) != 1 || got[0].ID != "acme" {
		t.Errorf("acme Tenants = %+v", got)
	}
	if got := r.Tenants(tenant.Principal{Tenant: "ghost", Scope: api.ScopeFull}); got == nil || len(got) != 0 {
		t.Errorf("Tenants of an unknown tenant = %#v, want empty non-nil", got)
	}

	if _, err := r.Tenant(acme, "acme"); err != nil {
		t.Errorf("Tenant(own) = %v", err)
	}
	// Another tenant's id and an unknown id read the same.
	_, errOther := r.Tenant(acme, "zeta")
	_, errAdmin := r.Tenant(acme, api.AdminTenant)
	if !errdefs.IsNotFound(errOther) || !errdefs.IsNotFound(errAdmin) {
		t.Errorf("Tenant(other) = %v, Tenant(admin) = %v; want ErrNotFound", errOther, errAdmin)
	}
	_, errGhost := r.Tenant(tenant.Admin, "zeta-ghost")
	if !errdefs.IsNotFound(errGhost) {
		t.Errorf("Tenant(unknown) = %v", errGhost)
	}
	if got, err := r.Tenant(tenant.Admin, api.AdminTenant); err != nil || got.ID != api.AdminTenant || got.Quotas != (api.Quotas{}) {
		t.Errorf("Tenant(admin) = %+v, %v", got, err)
	}
	if !r.Exists(api.AdminTenant) || !r.Exists("acme") || r.Exists("ghost") {
		t.Error("Exists wrong")
	}
}

func TestUpdateTenant(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{MaxSandboxes: 1})
	q := api.Quotas{MaxSandboxes: 7, DiskBytes: 5}
	got, err := r.UpdateTenant(t.Context(), "acme", q)
	if err != nil || got.Quotas != q {
		t.Fatalf("UpdateTenant = %+v, %v", got, err)
	}
	if tn, _ := r.Tenant(tenant.Admin, "acme"); tn.Quotas != q {
		t.Errorf("after update: %+v", tn)
	}
	if _, err := r.UpdateTenant(t.Context(), "acme", api.Quotas{CPUSeconds: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative quota update = %v", err)
	}
	if _, err := r.UpdateTenant(t.Context(), "ghost", q); !errdefs.IsNotFound(err) {
		t.Errorf("update of unknown tenant = %v", err)
	}
}

// TestPersistence reopens the store file and checks that tenants, keys and
// revocations survive.
func TestPersistence(t *testing.T) {
	st, path := openStore(t)
	r, err := Open(t.Context(), st, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	q := api.Quotas{MaxSandboxes: 2, CPUSeconds: 1.5, PeriodSeconds: 60, DiskBytes: 1 << 20}
	acme := mustCreateTenant(t, r, "acme", q)
	mustCreateTenant(t, r, "beta", api.Quotas{})
	live := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead, Name: "ci"})
	dead := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	if err := r.RevokeKey(t.Context(), tenant.Admin, dead.ID); err != nil {
		t.Fatal(err)
	}
	wantKeys := r.Keys(tenant.Admin)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st2, err := store.Open(path)
	if err != nil {
		t.Fatalf("reopening store: %v", err)
	}
	t.Cleanup(func() { _ = st2.Close() })
	r2, err := Open(t.Context(), st2, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	if got := r2.Tenants(tenant.Admin); len(got) != 2 || !reflect.DeepEqual(got[0], acme) || got[1].ID != "beta" {
		t.Errorf("reopened tenants = %+v, want acme %+v and beta", got, acme)
	}
	if got := r2.Keys(tenant.Admin); !keysEqual(got, wantKeys) {
		t.Errorf("reopened keys = %+v, want %+v", got, wantKeys)
	}
	p, err := r2.Authenticate(live.Key)
	if err != nil || p != (tenant.Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: live.ID}) {
		t.Errorf("Authenticate after reopen = %+v, %v", p, err)
	}
	if _, err := r2.Authenticate(dead.Key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("revoked key after reopen: %v", err)
	}
	// Deletion persists too.
	if err := r2.DeleteTenant(t.Context(), "beta"); err != nil {
		t.Fatal(err)
	}
	ts, err := st2.ListTenants(t.Context())
	if err != nil || len(ts) != 1 || ts[0].ID != "acme" {
		t.Errorf("stored tenants after delete = %+v, %v", ts, err)
	}
}

// keysEqual compares key lists, times by instant (a reloaded time has a
// different location pointer).
func keysEqual(a, b []api.APIKey) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.ID != y.ID || x.Tenant != y.Tenant || x.Scope != y.Scope || x.Name != y.Name || !x.CreatedAt.Equal(y.CreatedAt) {
			return false
		}
		if (x.RevokedAt == nil) != (y.RevokedAt == nil) || (x.RevokedAt != nil && !x.RevokedAt.Equal(*y.RevokedAt)) {
			return false
		}
	}
	return true
}

func TestDeleteTenant(t *testing.T) {
	r, st := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	k1 := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	k2 := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	kb := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	p1, _ := r.Authenticate(k1.Key)
	pb, _ := r.Authenticate(kb.Key)
	ctx1, done1 := r.Track(t.Context(), p1)
	defer done1()
	ctxb, doneb := r.Track(t.Context(), pb)
	defer doneb()

	if err := r.DeleteTenant(t.Context(), "acme"); err != nil {
		t.Fatalf("DeleteTenant: %v", err)
	}
	if r.Exists("acme") {
		t.Error("deleted tenant exists")
	}
	if _, err := r.Tenant(tenant.Admin, "acme"); !errdefs.IsNotFound(err) {
		t.Errorf("Tenant(deleted) = %v", err)
	}
	for _, k := range []api.CreatedAPIKey{k1, k2} {
		if _, err := r.Authenticate(k.Key); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("key %s of the deleted tenant authenticates: %v", k.ID, err)
		}
	}
	if !errors.Is(context.Cause(ctx1), ErrKeyRevoked) {
		t.Errorf("request of the deleted tenant: cause %v", context.Cause(ctx1))
	}
	if ctxb.Err() != nil {
		t.Error("another tenant's request was cancelled")
	}
	if _, err := r.Authenticate(kb.Key); err != nil {
		t.Errorf("other tenant's key: %v", err)
	}
	// The revocations are stored.
	recs, err := st.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if (rec.Key.Tenant == "acme") != (rec.Key.RevokedAt != nil) {
			t.Errorf("stored key %+v", rec.Key)
		}
	}
	ts, _ := st.ListTenants(t.Context())
	if len(ts) != 1 || ts[0].ID != "beta" {
		t.Errorf("stored tenants %+v", ts)
	}

	if err := r.DeleteTenant(t.Context(), "acme"); !errdefs.IsNotFound(err) {
		t.Errorf("second DeleteTenant = %v", err)
	}
	if err := r.DeleteTenant(t.Context(), api.AdminTenant); !errdefs.IsNotFound(err) {
		t.Errorf("DeleteTenant(admin) = %v", err)
	}
	// No key can be created for it any more; the id may be reused, and the
	// old keys stay dead.
	if _, err := r.CreateKey(t.Context(), tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"}); !errdefs.IsNotFound(err) {
		t.Errorf("CreateKey for deleted tenant = %v", err)
	}
	mustCreateTenant(t, r, "acme", api.Quotas{})
	if _, err := r.Authenticate(k1.Key); err == nil {
		t.Error("old key works for the re-created tenant")
	}
}

// TestDeleteTenantRacesCreateKey checks that no usable key outlives its
// tenant when keys are created while the tenant is deleted.
func TestDeleteTenantRacesCreateKey(t *testing.T) {
	r, _ := newRegistry(t)
	for i := range 10 {
		id := fmt.Sprintf("t%d", i)
		mustCreateTenant(t, r, id, api.Quotas{})
		mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: id})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := r.CreateKey(t.Context(), tenant.Admin, api.CreateAPIKeyRequest{Tenant: id}); err != nil {
						if !errdefs.IsNotFound(err) {
							t.Errorf("CreateKey: %v", err)
						}
						return
					}
				}
			})
		}
		if err := r.DeleteTenant(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		for _, k := range r.Keys(tenant.Admin) {
			if k.Tenant == id && k.RevokedAt == nil {
				t.Fatalf("key %s of deleted tenant %s is still valid", k.ID, id)
			}
		}
	}
}

// faultyStore fails the writes named in fail; the rest goes to the real
// store.
type faultyStore struct {
	*store.Bolt
	mu   sync.Mutex
	fail map[string]bool
}

var errDisk = fmt.Errorf("disk on fire: %w", errdefs.ErrUnavailable)

func (f *faultyStore) failing(op string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail[op]
}

func (f *faultyStore) set(op string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = on
}

func (f *faultyStore) PutTenant(ctx context.Context, t api.Tenant) error {
	if f.failing("PutTenant") {
		return errDisk
	}
	return f.Bolt.PutTenant(ctx, t)
}

func (f *faultyStore) DeleteTenant(ctx context.Context, id string) error {
	if f.failing("DeleteTenant") {
		return errDisk
	}
	return f.Bolt.DeleteTenant(ctx, id)
}

func (f *faultyStore) PutAPIKey(ctx context.Context, rec store.APIKeyRecord) error {
	if f.failing("PutAPIKey") {
		return errDisk
	}
	return f.Bolt.PutAPIKey(ctx, rec)
}

func (f *faultyStore) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	if f.failing("ListTenants") {
		return nil, errDisk
	}
	return f.Bolt.ListTenants(ctx)
}

func (f *faultyStore) ListAPIKeys(ctx context.Context) ([]store.APIKeyRecord, error) {
	if f.failing("ListAPIKeys") {
		return nil, errDisk
	}
	return f.Bolt.ListAPIKeys(ctx)
}

// TestStoreFailures checks that a failed write is reported and leaves the
// registry as it was.
func TestStoreFailures(t *testing.T) {
	bolt, _ := openStore(t)
	st := &faultyStore{Bolt: bolt, fail: map[string]bool{}}
	for _, op := range []string{"ListTenants", "ListAPIKeys"} {
		st.set(op, true)
		if _, err := Open(t.Context(), st, quietLog); !errors.Is(err, errDisk) {
			t.Errorf("Open with failing %s = %v", op, err)
		}
		st.set(op, false)
	}
	r, err := Open(t.Context(), st, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mustCreateTenant(t, r, "acme", api.Quotas{MaxSandboxes: 1})
	k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	p, _ := r.Authenticate(k.Key)
	tracked, done := r.Track(ctx, p)
	defer done()

	st.set("PutTenant", true)
	if _, err := r.CreateTenant(ctx, api.CreateTenantRequest{ID: "beta"}); !errors.Is(err, errDisk) || r.Exists("beta") {
		t.Errorf("CreateTenant on failing store = %v, exists %v", err, r.Exists("beta"))
	}
	if _, err := r.UpdateTenant(ctx, "acme", api.Quotas{MaxSandboxes: 9}); !errors.Is(err, errDisk) {
		t.Errorf("UpdateTenant on failing store = %v", err)
	}
	if tn, _ := r.Tenant(tenant.Admin, "acme"); tn.Quotas.MaxSandboxes != 1 {
		t.Errorf("failed update changed quotas: %+v", tn.Quotas)
	}
	st.set("PutTenant", false)

	st.set("PutAPIKey", true)
	before := len(r.Keys(tenant.Admin))
	if _, err := r.CreateKey(ctx, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"}); !errors.Is(err, errDisk) || len(r.Keys(tenant.Admin)) != before {
		t.Errorf("CreateKey on failing store = %v", err)
	}
	if err := r.RevokeKey(ctx, tenant.Admin, k.ID); !errors.Is(err, errDisk) {
		t.Errorf("RevokeKey on failing store = %v", err)
	}
	if err := r.DeleteTenant(ctx, "acme"); !errors.Is(err, errDisk) {
		t.Errorf("DeleteTenant on failing store = %v", err)
	}
	// The key is neither revoked in memory nor were its requests ended,
	// and the tenant is still there.
	if _, err := r.Authenticate(k.Key); err != nil || tracked.Err() != nil || !r.Exists("acme") {
		t.Errorf("after failed revocations: auth %v, request %v, tenant exists %v", err, tracked.Err(), r.Exists("acme"))
	}
	st.set("PutAPIKey", false)

	// The keys are revoked but the tenant's deletion fails: the tenant
	// stays, its keys are dead (retrying the delete finishes the job).
	st.set("DeleteTenant", true)
	if err := r.DeleteTenant(ctx, "acme"); !errors.Is(err, errDisk) || !r.Exists("acme") {
		t.Errorf("DeleteTenant with failing delete = %v, exists %v", err, r.Exists("acme"))
	}
	if _, err := r.Authenticate(k.Key); err == nil || !errors.Is(context.Cause(tracked), ErrKeyRevoked) {
		t.Errorf("keys survived a delete that got as far as revoking them: %v", err)
	}
	st.set("DeleteTenant", false)
	if err := r.DeleteTenant(ctx, "acme"); err != nil || r.Exists("acme") {
		t.Errorf("retried DeleteTenant = %v", err)
	}
}

// RevokeTenantKeys revokes every key of one tenant and ends its requests
// in flight, and leaves the tenant and other tenants' keys alone.
func TestRevokeTenantKeys(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	ka := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	kb := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	pa, _ := r.Authenticate(ka.Key)
	ctx, done := r.Track(t.Context(), pa)
	defer done()
	if err := r.RevokeTenantKeys(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(ka.Key); err == nil {
		t.Error("a revoked tenant key still authenticates")
	}
	if ctx.Err() == nil {
		t.Error("a request in flight with the revoked key goes on")
	}
	if _, err := r.Authenticate(kb.Key); err != nil {
		t.Errorf("another tenant's key: %v", err)
	}
	if !r.Exists("acme") {
		t.Error("RevokeTenantKeys deleted the tenant")
	}
	if err := r.RevokeTenantKeys(t.Context(), "nobody"); !errdefs.IsNotFound(err) {
		t.Errorf("RevokeTenantKeys(unknown) = %v", err)
	}
}
