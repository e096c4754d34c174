// Package registry holds the tenants and their API keys (Registry: random
// keys stored hashed, scoped, revocable with live requests ended) and
// admits work against per-tenant quotas (quota.go, disk.go). The caller's
// identity (tenant.Principal) is package tenant's.
package registry

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Key format: "abx_<id>_<secret>", id 16 characters of [a-z0-9] (public,
// names the key in lists and revocation), secret 64 hex digits (256 random
// bits). Only the SHA-256 of the whole key is stored: with 256 bits of
// entropy a fast hash is as strong as a slow one, and authentication stays
// a map lookup plus one hash.
const (
	keyPrefix   = "abx_"
	keyIDLen    = 16
	keySecretSz = 32
	maxKeyName  = 128
)

// Registry holds the tenants and API keys. It keeps them in memory, backed
// by a TenantStore, and tracks the requests made with each key so that
// revoking a key ends them.
//
// All methods are safe for concurrent use.
type Registry struct {
	st  store.TenantStore
	log *slog.Logger
	now func() time.Time

	// mu guards the fields below.
	mu      sync.Mutex
	tenants map[string]api.Tenant
	keys    map[string]store.APIKeyRecord // by key id
	live    map[string]map[*liveReq]struct{}
	quota   quotaState
}

// liveReq is one in-flight request made with a key.
type liveReq struct{ cancel context.CancelCauseFunc }

// Open loads the registry from st.
func Open(ctx context.Context, st store.TenantStore, log *slog.Logger) (*Registry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{st: st, log: log, now: time.Now, tenants: map[string]api.Tenant{}, keys: map[string]store.APIKeyRecord{}, live: map[string]map[*liveReq]struct{}{}}
	ts, err := st.ListTenants(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading tenants: %w", err)
	}
	for _, t := range ts {
		r.tenants[t.ID] = t
	}
	ks, err := st.ListAPIKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading API keys: %w", err)
	}
	for _, k := range ks {
		r.keys[k.Key.ID] = k
	}
	r.quota.pending = map[string]*reservation{}
	return r, nil
}

// notFound is the one error for a tenant the caller may not see, whether
// or not it exists.
func notFound(id string) error { return fmt.Errorf("tenant %s: %w", id, errdefs.ErrNotFound) }

// CreateTenant creates a tenant. The id must be new and not "admin".
func (r *Registry) CreateTenant(ctx context.Context, req api.CreateTenantRequest) (api.Tenant, error) {
	if err := tenant.ValidID(req.ID); err != nil {
		return api.Tenant{}, err
	}
	if req.ID == api.AdminTenant {
		return api.Tenant{}, fmt.Errorf("tenant %s is reserved: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	if err := validQuotas(req.Quotas); err != nil {
		return api.Tenant{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tenants[req.ID]; ok {
		return api.Tenant{}, fmt.Errorf("tenant %s: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	t := api.Tenant{ID: req.ID, Quotas: req.Quotas, CreatedAt: r.now().UTC().Truncate(time.Second)}
	if err := r.st.PutTenant(ctx, t); err != nil {
		return api.Tenant{}, err
	}
	r.tenants[t.ID] = t
	r.log.InfoContext(ctx, "tenant created", "tenant", t.ID)
	return t, nil
}

func validQuotas(q api.Quotas) error {
	if q.MaxSandboxes < 0 || q.CPUSeconds < 0 || q.PeriodSeconds < 0 || q.DiskBytes < 0 {
		return fmt.Errorf("quotas must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Tenants lists the tenants p may see, ordered by id: all of them for the
// admin, its own for anyone else.
func (r *Registry) Tenants(p tenant.Principal) []api.Tenant {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []api.Tenant{}
	for _, t := range r.tenants {
		if p.Sees(t.ID) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b api.Tenant) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Tenant returns tenant id if p may see it. The admin tenant exists
// implicitly, without quotas.
func (r *Registry) Tenant(p tenant.Principal, id string) (api.Tenant, error) {
	if !p.Sees(id) {
		return api.Tenant{}, notFound(id)
	}
	if id == api.AdminTenant {
		return api.Tenant{ID: api.AdminTenant}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[id]
	if !ok {
		return api.Tenant{}, notFound(id)
	}
	return t, nil
}

// Exists reports whether tenant id exists (the admin tenant always does).
func (r *Registry) Exists(id string) bool {
	if id == api.AdminTenant {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.tenants[id]
	return ok
}

// UpdateTenant replaces the quotas of tenant id.
func (r *Registry) UpdateTenant(ctx context.Context, id string, q api.Quotas) (api.Tenant, error) {
	if err := validQuotas(q); err != nil {
		return api.Tenant{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[id]
	if !ok {
		return api.Tenant{}, notFound(id)
	}
	t.Quotas = q
	if err := r.st.PutTenant(ctx, t); err != nil {
		return api.Tenant{}, err
	}
	r.tenants[id] = t
	r.log.InfoContext(ctx, "tenant quotas changed", "tenant", id)
	return t, nil
}

// RevokeTenantKeys revokes every key of tenant id and ends the requests
// in flight with them (RevokeKey), leaving the tenant: the first step of
// deleting it, after which nothing new is made in its name through a key.
func (r *Registry) RevokeTenantKeys(ctx context.Context, id string) error {
	r.mu.Lock()
	var reqs []map[*liveReq]struct{}
	_, ok := r.tenants[id]
	var err error
	if !ok {
		err = notFound(id)
	} else {
		err = r.revokeTenantKeysLocked(ctx, id, &reqs)
	}
	r.mu.Unlock()
	cancelAll(reqs)
	return err
}

// DeleteTenant revokes every key of tenant id and deletes it. The caller
// makes sure the tenant owns nothing that must outlive it.
func (r *Registry) DeleteTenant(ctx context.Context, id string) error {
	// The keys are revoked and the tenant deleted under one hold of mu, so
	// that a key created concurrently (CreateKey checks the tenant under
	// mu) is either revoked here or refused.
	r.mu.Lock()
	var reqs []map[*liveReq]struct{}
	err := r.deleteTenantLocked(ctx, id, &reqs)
	r.mu.Unlock()
	cancelAll(reqs)
	if err != nil {
		return err
	}
	r.log.InfoContext(ctx, "tenant deleted", "tenant", id, "keys_revoked", len(reqs))
	return nil
}

func cancelAll(reqs []map[*liveReq]struct{}) {
	for _, set := range reqs {
		for lr := range set {
			lr.cancel(ErrKeyRevoked)
		}
	}
}

func (r *Registry) deleteTenantLocked(ctx context.Context, id string, reqs *[]map[*liveReq]struct{}) error {
	if _, ok := r.tenants[id]; !ok {
		return notFound(id)
	}
	if err := r.revokeTenantKeysLocked(ctx, id, reqs); err != nil {
		return err
	}
	if err := r.st.DeleteTenant(ctx, id); err != nil {
		return err
	}
	delete(r.tenants, id)
	return nil
}

// revokeTenantKeysLocked revokes the keys of tenant id that are not
// revoked yet and adds their live requests to reqs.
func (r *Registry) revokeTenantKeysLocked(ctx context.Context, id string, reqs *[]map[*liveReq]struct{}) error {
	for kid, k := range r.keys {
		if k.Key.Tenant != id || k.Key.RevokedAt != nil {
			continue
		}
		set, err := r.revokeLocked(ctx, kid)
		if err != nil {
			return fmt.Errorf("revoking the keys of tenant %s: %w", id, err)
		}
		*reqs = append(*reqs, set)
	}
	return nil
}

// CreateKey creates an API key for req.Tenant (default: p's own tenant;
// only the admin may name another) and returns it. This is the only time
// the key is available: the registry keeps its hash.
func (r *Registry) CreateKey(ctx context.Context, p tenant.Principal, req api.CreateAPIKeyRequest) (api.CreatedAPIKey, error) {
	if req.Tenant == "" {
		req.Tenant = p.Tenant
	}
	switch req.Scope {
	case "":
		req.Scope = api.ScopeFull
	case api.ScopeFull, api.ScopeRead:
	default:
		return api.CreatedAPIKey{}, fmt.Errorf("scope %q: want %q or %q: %w", req.Scope, api.ScopeFull, api.ScopeRead, errdefs.ErrInvalidArgument)
	}
	if len(req.Name) > maxKeyName || strings.ContainsFunc(req.Name, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return api.CreatedAPIKey{}, fmt.Errorf("key name: at most %d bytes, no control characters: %w", maxKeyName, errdefs.ErrInvalidArgument)
	}
	if !p.Sees(req.Tenant) || !r.Exists(req.Tenant) {
		return api.CreatedAPIKey{}, notFound(req.Tenant)
	}
	// A read-only key must not mint a full one (the edge refuses writes
	// for read keys; this holds even without it).
	if !p.CanWrite() {
		return api.CreatedAPIKey{}, fmt.Errorf("a read-only key cannot create keys: %w", errdefs.ErrPermissionDenied)
	}
	id, secret := newKeyID(), make([]byte, keySecretSz)
	_, _ = rand.Read(secret) // crypto/rand.Read never fails on Linux
	key := keyPrefix + id + "_" + hex.EncodeToString(secret)
	sum := sha256.Sum256([]byte(key))
	rec := store.APIKeyRecord{
		Key:  api.APIKey{ID: id, Tenant: req.Tenant, Scope: req.Scope, Name: req.Name, CreatedAt: r.now().UTC().Truncate(time.Second)},
		Hash: hex.EncodeToString(sum[:]),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Again under mu: the tenant may have been deleted meanwhile, and
	// DeleteTenant revokes only the keys it finds.
	if _, ok := r.tenants[req.Tenant]; !ok && req.Tenant != api.AdminTenant {
		return api.CreatedAPIKey{}, notFound(req.Tenant)
	}
	if err := r.st.PutAPIKey(ctx, rec); err != nil {
		return api.CreatedAPIKey{}, err
	}
	r.keys[id] = rec
	r.log.InfoContext(ctx, "API key created", "key", id, "tenant", req.Tenant, "scope", req.Scope)
	return api.CreatedAPIKey{APIKey: rec.Key, Key: key}, nil
}

func newKeyID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [keyIDLen]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// Keys lists the keys p may see (its tenant's; every key for the admin),
// revoked ones included, oldest first.
func (r *Registry) Keys(p tenant.Principal) []api.APIKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []api.APIKey{}
	for _, k := range r.keys {
		if p.Sees(k.Key.Tenant) {
			out = append(out, k.Key)
		}
	}
	slices.SortFunc(out, func(a, b api.APIKey) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// ErrKeyRevoked is the cause of the contexts of requests whose key was
// revoked while they ran.
var ErrKeyRevoked = fmt.Errorf("API key revoked: %w", errdefs.ErrUnauthenticated)

// RevokeKey revokes key id (one p may see) and cancels, with cause
// ErrKeyRevoked, the context of every request in flight with it: open exec
// and attach streams end at once. Revoking a revoked key is no error.
func (r *Registry) RevokeKey(ctx context.Context, p tenant.Principal, id string) error {
	r.mu.Lock()
	rec, ok := r.keys[id]
	if !ok || !p.Sees(rec.Key.Tenant) {
		r.mu.Unlock()
		return fmt.Errorf("API key %s: %w", id, errdefs.ErrNotFound)
	}
	if !p.CanWrite() {
		r.mu.Unlock()
		return fmt.Errorf("a read-only key cannot revoke keys: %w", errdefs.ErrPermissionDenied)
	}
	reqs, err := r.revokeLocked(ctx, id)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	for lr := range reqs {
		lr.cancel(ErrKeyRevoked)
	}
	r.log.InfoContext(ctx, "API key revoked", "key", id, "tenant", rec.Key.Tenant, "live_requests_ended", len(reqs))
	return nil
}

// revokeLocked marks the known key id revoked, in the store and in memory,
// and detaches its live requests; the caller cancels them once mu is
// released.
func (r *Registry) revokeLocked(ctx context.Context, id string) (map[*liveReq]struct{}, error) {
	rec := r.keys[id]
	if rec.Key.RevokedAt == nil {
		now := r.now().UTC().Truncate(time.Second)
		rec.Key.RevokedAt = &now
		if err := r.st.PutAPIKey(ctx, rec); err != nil {
			return nil, err
		}
		r.keys[id] = rec
	}
	reqs := r.live[id]
	delete(r.live, id)
	return reqs, nil
}

// Authenticate returns the principal of an API key. Unknown, malformed and
// revoked keys are all ErrUnauthenticated with the same message; the hash
// comparison takes constant time.
func (r *Registry) Authenticate(key string) (tenant.Principal, error) {
	bad := fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok || len(rest) <= keyIDLen || rest[keyIDLen] != '_' {
		return tenant.Principal{}, bad
	}
	id := rest[:keyIDLen]
	sum := sha256.Sum256([]byte(key))
	r.mu.Lock()
	rec, ok := r.keys[id]
	r.mu.Unlock()
	if !ok {
		return tenant.Principal{}, bad
	}
	want, err := hex.DecodeString(rec.Hash)
	if err != nil || subtle.ConstantTimeCompare(want, sum[:]) != 1 || rec.Key.RevokedAt != nil {
		return tenant.Principal{}, bad
	}
	return tenant.Principal{Tenant: rec.Key.Tenant, Scope: rec.Key.Scope, KeyID: id}, nil
}

// Track ties a request made by p to its key: the returned context is
// cancelled (cause ErrKeyRevoked) when the key is revoked. done must be
// called when the request ends. A principal without a key is not tracked.
// If the key was revoked between Authenticate and Track, the context is
// cancelled already.
func (r *Registry) Track(ctx context.Context, p tenant.Principal) (_ context.Context, done func()) {
	if p.KeyID == "" {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	lr := &liveReq{cancel: cancel}
	r.mu.Lock()
	rec, ok := r.keys[p.KeyID]
	if !ok || rec.Key.RevokedAt != nil {
		r.mu.Unlock()
		cancel(ErrKeyRevoked)
		return ctx, func() {}
	}
	set := r.live[p.KeyID]
	if set == nil {
		set = map[*liveReq]struct{}{}
		r.live[p.KeyID] = set
	}
	set[lr] = struct{}{}
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		if set := r.live[p.KeyID]; set != nil {
			delete(set, lr)
			if len(set) == 0 {
				delete(r.live, p.KeyID)
			}
		}
		r.mu.Unlock()
		cancel(context.Canceled)
	}
}

// ownedByAdmin reports whether objects of tenant id (as stored: "" is
// the admin) belong to the admin tenant, which no quota limits.
func ownedByAdmin(id string) bool { return tenant.Owner(id) == api.AdminTenant }
