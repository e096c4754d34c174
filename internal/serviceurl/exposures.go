// Package serviceurl serves service URLs: authenticated HTTP (and
// WebSocket) access to a port inside a sandbox, from outside the host,
// without port forwarding (docs/SERVICE-URLS.md).
//
// Three parts, each usable alone:
//   - Proxy (proxy.go) reaches a port inside a sandbox through its guest
//     and serves a request with it; it knows no tokens.
//   - Signer (token.go) mints and checks tokens and browser-link
//     parameters: HMACs over an exposure's record.
//   - Exposures (this file) is the feature: the exposure records (stored,
//     so they survive a restart; deleted with their sandbox or tenant),
//     the API that makes, lists and revokes them, and the gateway that
//     routes a request by host ({port}-{id}.{domain}) or path
//     (/v1/sandboxes/{id}/ports/{port}/...), checks its token and hands it
//     to the Proxy.
package serviceurl

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Config configures Exposures.
type Config struct {
	// Store keeps the exposure records (required).
	Store store.ExposureStore
	// Signer mints and checks tokens (required).
	Signer *Signer
	// Domain, when set, turns on host-based addresses:
	// {port}-{id}.{Domain}. It may end in ":port" (the port the addresses
	// are reached on, as in the URLs the API returns); requests match on
	// the host name alone.
	Domain string
	// PublicURL is the daemon's address as clients reach it
	// ("https://box.example.com:8443"), the base of the URLs the API
	// returns ("" with no Domain: the API returns paths only). With a
	// Domain, its scheme is the scheme of host-based URLs.
	PublicURL string
	// Reserved, when set, reports the ports inside a sandbox that are the
	// platform's (the tunnel's: the API bridge, the egress proxy): they
	// are never exposed, since a service URL would hand whoever holds it
	// what only the sandbox's own programs may use.
	Reserved func(port int) bool
	// Logger is required.
	Logger *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Exposures is the service URL feature: a sandbox.Extension (delete and
// purge hooks forget a sandbox's and a tenant's exposures, which revokes
// their tokens), the exposure API and the gateway. Safe for concurrent use.
type Exposures struct {
	cfg   Config
	log   *slog.Logger
	proxy *Proxy
	core  sandbox.Core

	// mu guards byID.
	mu   sync.Mutex
	byID map[string]store.ExposureRecord
}

var (
	_ sandbox.Extension   = (*Exposures)(nil)
	_ sandbox.Provisioner = (*Exposures)(nil)
	_ sandbox.DeleteHook  = (*Exposures)(nil)
	_ sandbox.PurgeHook   = (*Exposures)(nil)
)

// New loads the stored exposures (expired ones are deleted) and returns
// the feature. It serves nothing until Provision has given it the core.
func New(ctx context.Context, cfg Config) (*Exposures, error) {
	if cfg.Store == nil || cfg.Signer == nil || cfg.Logger == nil {
		return nil, fmt.Errorf("service URLs: store, signer and logger are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	recs, err := cfg.Store.ListExposures(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading service URL exposures: %w", err)
	}
	e := &Exposures{cfg: cfg, log: cfg.Logger, byID: make(map[string]store.ExposureRecord, len(recs))}
	now := cfg.Now()
	for _, rec := range recs {
		if !now.Before(rec.ExpiresAt) {
			if err := cfg.Store.DeleteExposure(ctx, rec.ID); err != nil {
				e.log.WarnContext(ctx, "deleting an expired exposure", "exposure", rec.ID, "err", err)
			}
			continue
		}
		e.byID[rec.ID] = rec
	}
	return e, nil
}

// Name implements sandbox.Extension.
func (e *Exposures) Name() string { return "serviceurl" }

// Provision implements sandbox.Provisioner: the gateway reaches sandboxes
// through the core.
func (e *Exposures) Provision(c sandbox.Core) error {
	e.core = c
	e.proxy = NewProxy(c, e.log)
	return nil
}

// Proxy returns the proxy the gateway uses (after Provision), for other
// front doors that route to sandboxes' ports with their own credentials.
func (e *Exposures) Proxy() *Proxy { return e.proxy }

// Close implements io.Closer: idle connections to services are dropped.
func (e *Exposures) Close() error {
	if e.proxy != nil {
		return e.proxy.Close()
	}
	return nil
}

// OnDelete implements sandbox.DeleteHook: a deleted sandbox's exposures
// are deleted, so their tokens are dead.
func (e *Exposures) OnDelete(ctx context.Context, id string) {
	e.deleteWhere(ctx, func(r store.ExposureRecord) bool { return r.Sandbox == id })
}

// OnPurgeTenant implements sandbox.PurgeHook.
func (e *Exposures) OnPurgeTenant(ctx context.Context, t string) error {
	return e.deleteWhere(ctx, func(r store.ExposureRecord) bool { return tenant.Owner(r.Tenant) == t })
}

func (e *Exposures) deleteWhere(ctx context.Context, match func(store.ExposureRecord) bool) error {
	e.mu.Lock()
	var ids []string
	for id, r := range e.byID {
		if match(r) {
			ids = append(ids, id)
			delete(e.byID, id)
		}
	}
	e.mu.Unlock()
	var first error
	for _, id := range ids {
		if err := e.cfg.Store.DeleteExposure(ctx, id); err != nil {
			e.log.WarnContext(ctx, "deleting an exposure", "exposure", id, "err", err)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// Reconcile deletes the exposures of sandboxes that no longer exist (a
// sandbox deleted while the daemon was down, a record the store kept when
// a delete hook's write failed). The daemon calls it once the Manager has
// recovered its sandboxes.
func (e *Exposures) Reconcile(ctx context.Context) error {
	e.mu.Lock()
	sandboxes := make(map[string]bool)
	for _, r := range e.byID {
		sandboxes[r.Sandbox] = true
	}
	e.mu.Unlock()
	gone := make(map[string]bool)
	for id := range sandboxes {
		if _, err := e.core.Handle(tenant.WithPrincipal(ctx, tenant.Admin), id); errdefs.IsNotFound(err) {
			gone[id] = true
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return e.deleteWhere(ctx, func(r store.ExposureRecord) bool { return gone[r.Sandbox] })
}

// Expose makes port of sandbox id reachable (as the caller of ctx sees the
// sandbox: another tenant's is not found) for ttl (0: the default) and
// returns the exposure with its token and URLs.
func (e *Exposures) Expose(ctx context.Context, id string, req api.ExposeRequest) (api.Exposure, error) {
	if req.Port < 1 || req.Port > 65535 {
		return api.Exposure{}, fmt.Errorf("port %d is out of range 1..65535: %w", req.Port, errdefs.ErrInvalidArgument)
	}
	if e.reserved(req.Port) {
		return api.Exposure{}, fmt.Errorf("port %d inside a sandbox is the platform's own (the API bridge or the egress proxy) and cannot be exposed: %w", req.Port, errdefs.ErrInvalidArgument)
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	switch {
	case req.TTLSeconds < 0 || ttl > api.MaxExposeTTL:
		return api.Exposure{}, fmt.Errorf("ttl_seconds %d is out of range 0..%d: %w", req.TTLSeconds, int64(api.MaxExposeTTL/time.Second), errdefs.ErrInvalidArgument)
	case ttl == 0:
		ttl = api.DefaultExposeTTL
	}
	h, err := e.core.Handle(ctx, id)
	if err != nil {
		return api.Exposure{}, err
	}
	now := e.cfg.Now().UTC().Truncate(time.Second)
	rec := store.ExposureRecord{
		ID:        NewExposureID(),
		Sandbox:   h.ID(),
		Port:      req.Port,
		Tenant:    tenant.Owner(h.Owner()),
		CreatedAt: now,
		ExpiresAt: now.Add(ttl),
	}
	if err := e.cfg.Store.PutExposure(ctx, rec); err != nil {
		return api.Exposure{}, err
	}
	e.mu.Lock()
	e.byID[rec.ID] = rec
	e.mu.Unlock()
	// A delete that ran between the lookup and now would leave the record
	// behind: check the sandbox is still there.
	if _, err := e.core.Handle(ctx, rec.Sandbox); err != nil {
		e.deleteWhere(context.WithoutCancel(ctx), func(r store.ExposureRecord) bool { return r.ID == rec.ID })
		return api.Exposure{}, err
	}
	x := e.view(rec)
	x.Token = e.cfg.Signer.Token(rec)
	x.BrowserURL = e.browserURL(rec, x.URL, now)
	return x, nil
}

// browserURL is url with a fresh link parameter for rec, valid
// api.ServiceLinkTTL from now or until rec ends; "" without a url.
func (e *Exposures) browserURL(rec store.ExposureRecord, url string, now time.Time) string {
	if url == "" {
		return ""
	}
	exp := now.Add(api.ServiceLinkTTL)
	if rec.ExpiresAt.Before(exp) {
		exp = rec.ExpiresAt
	}
	return url + "?" + api.ServiceTokenParam + "=" + e.cfg.Signer.Link(rec, exp)
}

// ExposureLink returns exposure id (the caller's own: another tenant's is
// not found) with a fresh browser link, for a browser to open after the
// one Expose returned has run out. The token itself is not repeated.
func (e *Exposures) ExposureLink(ctx context.Context, id string) (api.Exposure, error) {
	p := tenant.From(ctx)
	rec, ok := e.lookup(id)
	now := e.cfg.Now()
	if !ok || !p.Sees(rec.Tenant) || !now.Before(rec.ExpiresAt) {
		return api.Exposure{}, fmt.Errorf("exposure %s: %w", clip(id), errdefs.ErrNotFound)
	}
	x := e.view(rec)
	if x.URL == "" {
		return api.Exposure{}, fmt.Errorf("the daemon has no public URL for browser links (serve --tcp, --public-url or --service-domain): %w", errdefs.ErrFailedPrecondition)
	}
	x.BrowserURL = e.browserURL(rec, x.URL, now)
	return x, nil
}

// ListExposures returns the live exposures the caller of ctx sees, of
// sandbox id only when id is not "", ordered by sandbox, port and id.
// Tokens are not included.
func (e *Exposures) ListExposures(ctx context.Context, id string) ([]api.Exposure, error) {
	p := tenant.From(ctx)
	if id != "" {
		h, err := e.core.Handle(ctx, id)
		if err != nil {
			return nil, err
		}
		id = h.ID()
	}
	now := e.cfg.Now()
	e.mu.Lock()
	var recs []store.ExposureRecord
	for _, r := range e.byID {
		if p.Sees(r.Tenant) && (id == "" || r.Sandbox == id) && now.Before(r.ExpiresAt) {
			recs = append(recs, r)
		}
	}
	e.mu.Unlock()
	slices.SortFunc(recs, func(a, b store.ExposureRecord) int {
		if c := strings.Compare(a.Sandbox, b.Sandbox); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := make([]api.Exposure, 0, len(recs))
	for _, r := range recs {
		out = append(out, e.view(r))
	}
	return out, nil
}

// RevokeExposure deletes exposure id (the caller's own: another tenant's
// is not found); its token stops working at once.
func (e *Exposures) RevokeExposure(ctx context.Context, id string) error {
	p := tenant.From(ctx)
	e.mu.Lock()
	r, ok := e.byID[id]
	if ok && p.Sees(r.Tenant) {
		delete(e.byID, id)
	}
	e.mu.Unlock()
	if !ok || !p.Sees(r.Tenant) {
		return fmt.Errorf("exposure %s: %w", clip(id), errdefs.ErrNotFound)
	}
	return e.cfg.Store.DeleteExposure(ctx, id)
}

// view is what clients see of rec, without the token.
func (e *Exposures) view(rec store.ExposureRecord) api.Exposure {
	t := Target{Sandbox: rec.Sandbox, Port: rec.Port}
	x := api.Exposure{
		ID: rec.ID, Sandbox: rec.Sandbox, Port: rec.Port, Tenant: rec.Tenant,
		CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt, Path: PathOf(t),
	}
	base := strings.TrimSuffix(e.cfg.PublicURL, "/")
	switch {
	case e.cfg.Domain != "":
		scheme := "http"
		if strings.HasPrefix(base, "https://") {
			scheme = "https"
		}
		x.URL = scheme + "://" + HostOf(t, e.cfg.Domain) + "/"
	case base != "":
		x.URL = base + x.Path
	}
	return x
}

func (e *Exposures) reserved(port int) bool {
	return e.cfg.Reserved != nil && e.cfg.Reserved(port)
}

// lookup returns the live record of exposure id.
func (e *Exposures) lookup(id string) (store.ExposureRecord, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.byID[id]
	return r, ok
}
