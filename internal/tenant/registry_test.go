package tenant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
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

func mustCreateKey(t *testing.T, r *Registry, p Principal, req api.CreateAPIKeyRequest) api.CreatedAPIKey {
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
	if got := r.Tenants(Admin); len(got) != 0 {
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
	if got, _ := r.Tenant(Admin, "acme"); got.Quotas != q {
		t.Errorf("a refused duplicate changed the tenant: %+v", got)
	}
}

func TestTenantsVisibility(t *testing.T) {
	r, _ := newRegistry(t)
	for _, id := range []string{"zeta", "acme", "mid"} {
		mustCreateTenant(t, r, id, api.Quotas{})
	}
	var ids []string
	for _, tn := range r.Tenants(Admin) {
		ids = append(ids, tn.ID)
	}
	if want := []string{"acme", "mid", "zeta"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("admin Tenants = %v, want %v", ids, want)
	}
	acme := Principal{Tenant: "acme", Scope: api.ScopeRead}
	if got := r.Tenants(acme); len(got) != 1 || got[0].ID != "acme" {
		t.Errorf("acme Tenants = %+v", got)
	}
	if got := r.Tenants(Principal{Tenant: "ghost", Scope: api.ScopeFull}); got == nil || len(got) != 0 {
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
	_, errGhost := r.Tenant(Admin, "zeta-ghost")
	if !errdefs.IsNotFound(errGhost) {
		t.Errorf("Tenant(unknown) = %v", errGhost)
	}
	if got, err := r.Tenant(Admin, api.AdminTenant); err != nil || got.ID != api.AdminTenant || got.Quotas != (api.Quotas{}) {
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
	if tn, _ := r.Tenant(Admin, "acme"); tn.Quotas != q {
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
	live := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead, Name: "ci"})
	dead := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	if err := r.RevokeKey(t.Context(), Admin, dead.ID); err != nil {
		t.Fatal(err)
	}
	wantKeys := r.Keys(Admin)
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
	if got := r2.Tenants(Admin); len(got) != 2 || !reflect.DeepEqual(got[0], acme) || got[1].ID != "beta" {
		t.Errorf("reopened tenants = %+v, want acme %+v and beta", got, acme)
	}
	if got := r2.Keys(Admin); !keysEqual(got, wantKeys) {
		t.Errorf("reopened keys = %+v, want %+v", got, wantKeys)
	}
	p, err := r2.Authenticate(live.Key)
	if err != nil || p != (Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: live.ID}) {
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

var keyRE = regexp.MustCompile(`^abx_([a-z0-9]{16})_([0-9a-f]{64})$`)

func TestCreateKeyFormatAndHashOnly(t *testing.T) {
	r, st := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	seen := map[string]bool{}
	for i := range 20 {
		k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: fmt.Sprintf("k%d", i)})
		m := keyRE.FindStringSubmatch(k.Key)
		if m == nil {
			t.Fatalf("key %q does not match %v", k.Key, keyRE)
		}
		if m[1] != k.ID {
			t.Errorf("key %q carries id %q, APIKey.ID is %q", k.Key, m[1], k.ID)
		}
		if seen[k.ID] || seen[m[2]] {
			t.Fatalf("repeated key id or secret: %q", k.Key)
		}
		seen[k.ID], seen[m[2]] = true, true
	}

	k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: "deploy"})
	if k.Tenant != "acme" || k.Scope != api.ScopeFull || k.Name != "deploy" || k.RevokedAt != nil || k.CreatedAt.IsZero() {
		t.Errorf("created key %+v", k.APIKey)
	}
	secret := keyRE.FindStringSubmatch(k.Key)[2]
	recs, err := st.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var rec *store.APIKeyRecord
	for i := range recs {
		if recs[i].Key.ID == k.ID {
			rec = &recs[i]
		}
	}
	if rec == nil {
		t.Fatalf("key %s not stored", k.ID)
	}
	if !reflect.DeepEqual(rec.Key, k.APIKey) && !keysEqual([]api.APIKey{rec.Key}, []api.APIKey{k.APIKey}) {
		t.Errorf("stored %+v, created %+v", rec.Key, k.APIKey)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(rec.Hash) {
		t.Errorf("stored hash %q is not hex SHA-256", rec.Hash)
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{k.Key, secret, secret[:16], secret[48:]} {
		if strings.Contains(string(raw), s) {
			t.Errorf("stored record %s contains %q of the key", raw, s)
		}
	}
	// The in-memory copy keeps only the hash too.
	r.mu.Lock()
	mem := r.keys[k.ID]
	r.mu.Unlock()
	if mem.Hash != rec.Hash {
		t.Errorf("memory hash %q, stored %q", mem.Hash, rec.Hash)
	}
}

func TestAuthenticate(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	full := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	read := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	adminKey := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{})
	revoked := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	if err := r.RevokeKey(t.Context(), Admin, revoked.ID); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		key  string
		want Principal
	}{
		{full.Key, Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: full.ID}},
		{read.Key, Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: read.ID}},
		{adminKey.Key, Principal{Tenant: api.AdminTenant, Scope: api.ScopeFull, KeyID: adminKey.ID}},
	} {
		p, err := r.Authenticate(tc.key)
		if err != nil || p != tc.want {
			t.Errorf("Authenticate(%s) = %+v, %v; want %+v", tc.key, p, err, tc.want)
		}
	}

	secret := full.Key[len("abx_")+16+1:]
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == '0' {
			b[i] = '1'
		} else {
			b[i] = '0'
		}
		return string(b)
	}
	bad := map[string]string{
		"empty":              "",
		"prefix only":        "abx_",
		"no prefix":          strings.TrimPrefix(full.Key, "abx_"),
		"other prefix":       "abc_" + strings.TrimPrefix(full.Key, "abx_"),
		"id only":            "abx_" + full.ID,
		"id and separator":   "abx_" + full.ID + "_",
		"truncated":          full.Key[:len(full.Key)-1],
		"truncated half":     full.Key[:len(full.Key)-32],
		"extended":           full.Key + "0",
		"wrong secret":       flip(full.Key, len(full.Key)-1),
		"other key's secret": "abx_" + full.ID + "_" + read.Key[len(read.Key)-64:],
		"unknown id":         "abx_" + strings.Repeat("z", 16) + "_" + secret,
		"short id":           "abx_" + full.ID[:15] + "_" + secret,
		"id with bad sep":    "abx_" + full.ID + "-" + secret,
		"upper case":         strings.ToUpper(full.Key),
		"whitespace":         " " + full.Key,
		"revoked":            revoked.Key,
	}
	var msg string
	for name, key := range bad {
		p, err := r.Authenticate(key)
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Authenticate(%q) = %+v, %v; want ErrUnauthenticated", name, key, p, err)
			continue
		}
		if p != (Principal{}) {
			t.Errorf("%s: failed Authenticate returned principal %+v", name, p)
		}
		if msg == "" {
			msg = err.Error()
		} else if err.Error() != msg {
			t.Errorf("%s: message %q differs from %q", name, err.Error(), msg)
		}
		if strings.Contains(err.Error(), full.ID) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: message %q echoes the key", name, err.Error())
		}
	}
}

func TestCreateKeyRequests(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: "x"}
	acmeRead := Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: "y"}

	// Tenant defaults to the caller's own, scope to full.
	k := mustCreateKey(t, r, acme, api.CreateAPIKeyRequest{})
	if k.Tenant != "acme" || k.Scope != api.ScopeFull {
		t.Errorf("defaulted key = %+v", k.APIKey)
	}
	k = mustCreateKey(t, r, acme, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	if k.Scope != api.ScopeRead {
		t.Errorf("read key = %+v", k.APIKey)
	}
	if k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "beta"}); k.Tenant != "beta" {
		t.Errorf("admin-made key = %+v", k.APIKey)
	}

	for _, tc := range []struct {
		name string
		p    Principal
		req  api.CreateAPIKeyRequest
		want error
	}{
		{"bad scope", acme, api.CreateAPIKeyRequest{Scope: "admin"}, errdefs.ErrInvalidArgument},
		{"upper scope", acme, api.CreateAPIKeyRequest{Scope: "FULL"}, errdefs.ErrInvalidArgument},
		{"long name", acme, api.CreateAPIKeyRequest{Name: strings.Repeat("n", 129)}, errdefs.ErrInvalidArgument},
		{"control in name", acme, api.CreateAPIKeyRequest{Name: "a\nb"}, errdefs.ErrInvalidArgument},
		{"del in name", acme, api.CreateAPIKeyRequest{Name: "a\x7fb"}, errdefs.ErrInvalidArgument},
		{"other tenant", acme, api.CreateAPIKeyRequest{Tenant: "beta"}, errdefs.ErrNotFound},
		{"admin tenant", acme, api.CreateAPIKeyRequest{Tenant: api.AdminTenant}, errdefs.ErrNotFound},
		{"unknown tenant by admin", Admin, api.CreateAPIKeyRequest{Tenant: "ghost"}, errdefs.ErrNotFound},
		{"read scope own", acmeRead, api.CreateAPIKeyRequest{}, errdefs.ErrPermissionDenied},
		{"read scope read key", acmeRead, api.CreateAPIKeyRequest{Scope: api.ScopeRead}, errdefs.ErrPermissionDenied},
		// Another tenant stays invisible to a read key too.
		{"read scope other", acmeRead, api.CreateAPIKeyRequest{Tenant: "beta"}, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(r.Keys(Admin))
			got, err := r.CreateKey(t.Context(), tc.p, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CreateKey = %+v, %v; want %v", got, err, tc.want)
			}
			if got.Key != "" || got.ID != "" {
				t.Errorf("refused CreateKey returned %+v", got)
			}
			if after := len(r.Keys(Admin)); after != before {
				t.Errorf("refused CreateKey stored a key (%d -> %d)", before, after)
			}
		})
	}
	if k := mustCreateKey(t, r, acme, api.CreateAPIKeyRequest{Name: strings.Repeat("n", 128) + ""}); len(k.Name) != 128 {
		t.Errorf("128-byte name: %+v", k.APIKey)
	}
}

// TestCreateKeyOtherTenantLooksUnknown checks that a tenant learns nothing
// about whether another tenant exists.
func TestCreateKeyOtherTenantLooksUnknown(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull}
	_, errMissing := r.CreateKey(t.Context(), acme, api.CreateAPIKeyRequest{Tenant: "beta"})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	_, errOther := r.CreateKey(t.Context(), acme, api.CreateAPIKeyRequest{Tenant: "beta"})
	if !errdefs.IsNotFound(errMissing) || !errdefs.IsNotFound(errOther) {
		t.Fatalf("missing: %v, other: %v; want ErrNotFound", errMissing, errOther)
	}
	if errMissing.Error() != errOther.Error() {
		t.Errorf("messages differ: %q (missing) vs %q (exists)", errMissing, errOther)
	}
}

func TestKeysFiltering(t *testing.T) {
	r, _ := newRegistry(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	var acmeIDs []string
	for i := range 3 {
		now = now.Add(time.Second)
		acmeIDs = append(acmeIDs, mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: fmt.Sprint(i)}).ID)
		now = now.Add(time.Second)
		mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	}
	mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{}) // an admin key, same second
	if err := r.RevokeKey(t.Context(), Admin, acmeIDs[1]); err != nil {
		t.Fatal(err)
	}

	all := r.Keys(Admin)
	if len(all) != 7 {
		t.Fatalf("admin sees %d keys, want 7", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.CreatedAt.After(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.ID > b.ID) {
			t.Errorf("keys out of order at %d: %+v then %+v", i, a, b)
		}
	}
	acme := r.Keys(Principal{Tenant: "acme", Scope: api.ScopeRead})
	var got []string
	for _, k := range acme {
		if k.Tenant != "acme" {
			t.Errorf("acme sees %+v", k)
		}
		got = append(got, k.ID)
	}
	if !reflect.DeepEqual(got, acmeIDs) {
		t.Errorf("acme keys = %v, want %v (oldest first, revoked included)", got, acmeIDs)
	}
	if acme[1].RevokedAt == nil || !acme[1].RevokedAt.Equal(now) {
		t.Errorf("revoked key shows RevokedAt %v, want %v", acme[1].RevokedAt, now)
	}
	if got := r.Keys(Principal{Tenant: "ghost", Scope: api.ScopeFull}); got == nil || len(got) != 0 {
		t.Errorf("unknown tenant sees %#v, want empty non-nil", got)
	}
}

func TestRevokeKey(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	ka := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	kb := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	acme := Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: ka.ID}
	acmeRead := Principal{Tenant: "acme", Scope: api.ScopeRead}

	// Another tenant's key reads like an unknown one and stays valid.
	errOther := r.RevokeKey(t.Context(), acme, kb.ID)
	if !errdefs.IsNotFound(errOther) {
		t.Errorf("revoking another tenant's key = %v, want ErrNotFound", errOther)
	}
	errUnknown := r.RevokeKey(t.Context(), acme, "zzzzzzzzzzzzzzzz")
	if !errdefs.IsNotFound(errUnknown) {
		t.Errorf("revoking an unknown key = %v, want ErrNotFound", errUnknown)
	}
	if want := strings.ReplaceAll(errUnknown.Error(), "zzzzzzzzzzzzzzzz", kb.ID); errOther.Error() != want {
		t.Errorf("messages differ: %q vs %q", errOther, want)
	}
	if _, err := r.Authenticate(kb.Key); err != nil {
		t.Errorf("beta's key after acme's attempt: %v", err)
	}
	// A read key cannot revoke, not even its tenant's keys.
	if err := r.RevokeKey(t.Context(), acmeRead, ka.ID); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("read-scope revoke = %v, want ErrPermissionDenied", err)
	}
	if _, err := r.Authenticate(ka.Key); err != nil {
		t.Errorf("key after refused revoke: %v", err)
	}

	// A key may revoke itself; revoking again is no error and keeps the
	// first revocation time.
	if err := r.RevokeKey(t.Context(), acme, ka.ID); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	first := r.Keys(acme)[0].RevokedAt
	if first == nil {
		t.Fatal("RevokedAt not set")
	}
	r.now = func() time.Time { return time.Now().Add(time.Hour) }
	if err := r.RevokeKey(t.Context(), Admin, ka.ID); err != nil {
		t.Errorf("second RevokeKey: %v", err)
	}
	if again := r.Keys(acme)[0].RevokedAt; !again.Equal(*first) {
		t.Errorf("second revoke moved RevokedAt %v -> %v", first, again)
	}
	if _, err := r.Authenticate(ka.Key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("revoked key authenticates: %v", err)
	}
}

func TestTrackRevokeCancelsOnlyThatKey(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	k1 := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	k2 := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	p1, err := r.Authenticate(k1.Key)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := r.Authenticate(k2.Key)
	if err != nil {
		t.Fatal(err)
	}

	var ctxs1 []context.Context
	var dones []func()
	for range 3 {
		ctx, done := r.Track(t.Context(), p1)
		ctxs1 = append(ctxs1, ctx)
		dones = append(dones, done)
	}
	ctx2, done2 := r.Track(t.Context(), p2)
	defer done2()
	// The admin without key, and the unix socket, are not tracked.
	ctxAdmin, doneAdmin := r.Track(t.Context(), Admin)
	defer doneAdmin()
	if ctxAdmin != t.Context() {
		t.Error("Track of a key-less principal wrapped the context")
	}
	r.mu.Lock()
	n1, n2, total := len(r.live[k1.ID]), len(r.live[k2.ID]), len(r.live)
	r.mu.Unlock()
	if n1 != 3 || n2 != 1 || total != 2 {
		t.Errorf("live = %d, %d (%d keys), want 3, 1 (2 keys)", n1, n2, total)
	}
	for _, ctx := range ctxs1 {
		if ctx.Err() != nil {
			t.Fatal("tracked context cancelled before revocation")
		}
	}

	if err := r.RevokeKey(t.Context(), Admin, k1.ID); err != nil {
		t.Fatal(err)
	}
	for i, ctx := range ctxs1 {
		select {
		case <-ctx.Done():
		default:
			t.Fatalf("request %d of the revoked key still alive", i)
		}
		if cause := context.Cause(ctx); !errors.Is(cause, ErrKeyRevoked) || !errors.Is(cause, errdefs.ErrUnauthenticated) {
			t.Errorf("request %d: cause %v, want ErrKeyRevoked", i, cause)
		}
	}
	if ctx2.Err() != nil {
		t.Errorf("the other key's request was cancelled: %v", context.Cause(ctx2))
	}
	r.mu.Lock()
	_, still := r.live[k1.ID]
	r.mu.Unlock()
	if still {
		t.Error("revoked key still tracked")
	}
	// done after revocation is harmless, also twice.
	for _, done := range dones {
		done()
		done()
	}
	if context.Cause(ctxs1[0]) != ErrKeyRevoked {
		t.Errorf("done replaced the cause: %v", context.Cause(ctxs1[0]))
	}

	// Track after revoke returns a context that is already over.
	late, doneLate := r.Track(t.Context(), p1)
	defer doneLate()
	if late.Err() == nil || !errors.Is(context.Cause(late), ErrKeyRevoked) {
		t.Errorf("Track after revoke: err %v, cause %v", late.Err(), context.Cause(late))
	}
	// So does Track for a key the registry does not know.
	ghost, doneGhost := r.Track(t.Context(), Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: "nope"})
	defer doneGhost()
	if !errors.Is(context.Cause(ghost), ErrKeyRevoked) {
		t.Errorf("Track of unknown key: cause %v", context.Cause(ghost))
	}
	r.mu.Lock()
	_, lateTracked := r.live[k1.ID]
	_, ghostTracked := r.live["nope"]
	r.mu.Unlock()
	if lateTracked || ghostTracked {
		t.Error("Track of a revoked or unknown key was recorded")
	}
}

func TestTrackDoneRemovesTracking(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	p, _ := r.Authenticate(k.Key)

	ctxA, doneA := r.Track(t.Context(), p)
	ctxB, doneB := r.Track(t.Context(), p)
	doneA()
	if ctxA.Err() == nil {
		t.Error("done did not release the request's context")
	}
	if errors.Is(context.Cause(ctxA), ErrKeyRevoked) {
		t.Error("a finished request reads as revoked")
	}
	r.mu.Lock()
	n := len(r.live[k.ID])
	r.mu.Unlock()
	if n != 1 || ctxB.Err() != nil {
		t.Errorf("after one done: %d tracked, other ctx err %v", n, ctxB.Err())
	}
	doneB()
	doneB()
	r.mu.Lock()
	_, ok := r.live[k.ID]
	total := len(r.live)
	r.mu.Unlock()
	if ok || total != 0 {
		t.Errorf("after all done: live = %d keys, entry for key present %v", total, ok)
	}

	// Parent cancellation propagates; done still cleans up.
	parent, cancel := context.WithCancel(t.Context())
	ctx, done := r.Track(parent, p)
	cancel()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("parent cancel not propagated: %v", ctx.Err())
	}
	done()

	// Many concurrent requests leave nothing behind.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, done := r.Track(t.Context(), p)
			done()
		})
	}
	wg.Wait()
	r.mu.Lock()
	total = len(r.live)
	r.mu.Unlock()
	if total != 0 {
		t.Errorf("live leaks %d keys", total)
	}
}

// TestTrackRevokeRace checks that a request tracked concurrently with its
// key's revocation always ends up cancelled, whichever comes first.
func TestTrackRevokeRace(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	for range 20 {
		k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
		p, err := r.Authenticate(k.Key)
		if err != nil {
			t.Fatal(err)
		}
		ctxs := make(chan context.Context, 8)
		var wg sync.WaitGroup
		for range cap(ctxs) {
			wg.Go(func() {
				ctx, done := r.Track(t.Context(), p)
				t.Cleanup(done)
				ctxs <- ctx
			})
		}
		if err := r.RevokeKey(t.Context(), Admin, k.ID); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(ctxs)
		for ctx := range ctxs {
			if !errors.Is(context.Cause(ctx), ErrKeyRevoked) {
				t.Fatalf("request survived revocation: cause %v", context.Cause(ctx))
			}
		}
	}
}

func TestDeleteTenant(t *testing.T) {
	r, st := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	k1 := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	k2 := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	kb := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
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
	if _, err := r.Tenant(Admin, "acme"); !errdefs.IsNotFound(err) {
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
	if _, err := r.CreateKey(t.Context(), Admin, api.CreateAPIKeyRequest{Tenant: "acme"}); !errdefs.IsNotFound(err) {
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
		mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: id})
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
					if _, err := r.CreateKey(t.Context(), Admin, api.CreateAPIKeyRequest{Tenant: id}); err != nil {
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
		for _, k := range r.Keys(Admin) {
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
	k := mustCreateKey(t, r, Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
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
	if tn, _ := r.Tenant(Admin, "acme"); tn.Quotas.MaxSandboxes != 1 {
		t.Errorf("failed update changed quotas: %+v", tn.Quotas)
	}
	st.set("PutTenant", false)

	st.set("PutAPIKey", true)
	before := len(r.Keys(Admin))
	if _, err := r.CreateKey(ctx, Admin, api.CreateAPIKeyRequest{Tenant: "acme"}); !errors.Is(err, errDisk) || len(r.Keys(Admin)) != before {
		t.Errorf("CreateKey on failing store = %v", err)
	}
	if err := r.RevokeKey(ctx, Admin, k.ID); !errors.Is(err, errDisk) {
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
