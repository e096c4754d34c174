package registry

// Tests of API keys: format and hashing, authentication, creation rules,
// listing, revocation and the tracking of live requests.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

var keyRE = regexp.MustCompile(`^abx_([a-z0-9]{16})_([0-9a-f]{64})$`)

func TestCreateKeyFormatAndHashOnly(t *testing.T) {
	r, st := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	seen := map[string]bool{}
	for i := range 20 {
		k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: fmt.Sprintf("k%d", i)})
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

	k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: "deploy"})
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
	full := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	read := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	adminKey := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{})
	revoked := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	if err := r.RevokeKey(t.Context(), tenant.Admin, revoked.ID); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		key  string
		want tenant.Principal
	}{
		{full.Key, tenant.Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: full.ID}},
		{read.Key, tenant.Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: read.ID}},
		{adminKey.Key, tenant.Principal{Tenant: api.AdminTenant, Scope: api.ScopeFull, KeyID: adminKey.ID}},
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
		if p != (tenant.Principal{}) {
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
	acme := tenant.Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: "x"}
	acmeRead := tenant.Principal{Tenant: "acme", Scope: api.ScopeRead, KeyID: "y"}

	// Tenant defaults to the caller's own, scope to full.
	k := mustCreateKey(t, r, acme, api.CreateAPIKeyRequest{})
	if k.Tenant != "acme" || k.Scope != api.ScopeFull {
		t.Errorf("defaulted key = %+v", k.APIKey)
	}
	k = mustCreateKey(t, r, acme, api.CreateAPIKeyRequest{Tenant: "acme", Scope: api.ScopeRead})
	if k.Scope != api.ScopeRead {
		t.Errorf("read key = %+v", k.APIKey)
	}
	if k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"}); k.Tenant != "beta" {
		t.Errorf("admin-made key = %+v", k.APIKey)
	}

	for _, tc := range []struct {
		name string
		p    tenant.Principal
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
		{"unknown tenant by admin", tenant.Admin, api.CreateAPIKeyRequest{Tenant: "ghost"}, errdefs.ErrNotFound},
		{"read scope own", acmeRead, api.CreateAPIKeyRequest{}, errdefs.ErrPermissionDenied},
		{"read scope read key", acmeRead, api.CreateAPIKeyRequest{Scope: api.ScopeRead}, errdefs.ErrPermissionDenied},
		// Another tenant stays invisible to a read key too.
		{"read scope other", acmeRead, api.CreateAPIKeyRequest{Tenant: "beta"}, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(r.Keys(tenant.Admin))
			got, err := r.CreateKey(t.Context(), tc.p, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CreateKey = %+v, %v; want %v", got, err, tc.want)
			}
			if got.Key != "" || got.ID != "" {
				t.Errorf("refused CreateKey returned %+v", got)
			}
			if after := len(r.Keys(tenant.Admin)); after != before {
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
	acme := tenant.Principal{Tenant: "acme", Scope: api.ScopeFull}
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
		acmeIDs = append(acmeIDs, mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme", Name: fmt.Sprint(i)}).ID)
		now = now.Add(time.Second)
		mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	}
	mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{}) // an admin key, same second
	if err := r.RevokeKey(t.Context(), tenant.Admin, acmeIDs[1]); err != nil {
		t.Fatal(err)
	}

	all := r.Keys(tenant.Admin)
	if len(all) != 7 {
		t.Fatalf("admin sees %d keys, want 7", len(all))
	}
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.CreatedAt.After(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.ID > b.ID) {
			t.Errorf("keys out of order at %d: %+v then %+v", i, a, b)
		}
	}
	acme := r.Keys(tenant.Principal{Tenant: "acme", Scope: api.ScopeRead})
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
	if got := r.Keys(tenant.Principal{Tenant: "ghost", Scope: api.ScopeFull}); got == nil || len(got) != 0 {
		t.Errorf("unknown tenant sees %#v, want empty non-nil", got)
	}
}

func TestRevokeKey(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{})
	mustCreateTenant(t, r, "beta", api.Quotas{})
	ka := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	kb := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "beta"})
	acme := tenant.Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: ka.ID}
	acmeRead := tenant.Principal{Tenant: "acme", Scope: api.ScopeRead}

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
	if err := r.RevokeKey(t.Context(), tenant.Admin, ka.ID); err != nil {
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
	k1 := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
	k2 := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
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
	ctxAdmin, doneAdmin := r.Track(t.Context(), tenant.Admin)
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

	if err := r.RevokeKey(t.Context(), tenant.Admin, k1.ID); err != nil {
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
	ghost, doneGhost := r.Track(t.Context(), tenant.Principal{Tenant: "acme", Scope: api.ScopeFull, KeyID: "nope"})
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
	k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
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
		k := mustCreateKey(t, r, tenant.Admin, api.CreateAPIKeyRequest{Tenant: "acme"})
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
		if err := r.RevokeKey(t.Context(), tenant.Admin, k.ID); err != nil {
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
