// Package warmpool keeps warm pools of sandboxes: per template, Size
// sandboxes are created ahead of need with the template's default
// resources and no network, then paused. A create of that template that
// asks for nothing a pooled sandbox lacks (default resources, no network
// policy, no hostname) is served from the pool: the sandbox is thawed, the
// request's env, labels, name, lifecycle, idle policy and lifetime are
// set, and its transition log starts over with its create. Its id and
// hostname were allocated when it was pooled (the hostname is set at
// guest setup; nothing inside can change it afterwards), and so were its
// fresh /etc/machine-id and random seed. The pool refills in the
// background.
//
// Keeper is an extension of the sandbox core (internal/sandbox): a
// sandbox.CreateInterceptor over the core's hidden sandboxes
// (sandbox.HiddenCore, core_pool.go there). Pooled sandboxes are hidden:
// invisible to every tenant until handed out, and deleted by the core's
// Recover when a daemon restarts (the pools refill fresh). Pool sizes set
// through the API are kept in <data>/pools.json.
package warmpool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/identity"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/validate"
)

// maxPoolSize bounds one template's pool.
const maxPoolSize = 64

// poolRetry is how long a pool whose create failed waits before it tries
// again.
const poolRetry = 5 * time.Second

// Config configures a Keeper.
type Config struct {
	// DataDir is the daemon's data dir; the sizes set through the API are
	// kept in DataDir/pools.json.
	DataDir string
	Logger  *slog.Logger
}

// Keeper keeps the daemon's warm pools. Build it with New, hand it to
// sandbox.New as an extension, and call SetPools once the core has
// recovered its sandboxes; nothing fills before that. Its methods are safe
// for concurrent use.
type Keeper struct {
	file string
	log  *slog.Logger
	// core is set by Provision, before any other method can be called.
	core sandbox.HiddenCore

	// inflight counts fills between their create and the moment the new
	// sandbox is either in a pool or deleted; DrainPools waits for it.
	inflight sync.WaitGroup

	// mu guards the fields below.
	mu     sync.Mutex
	pools  map[string]*pool
	closed bool
}

// pool is one template's warm pool.
type pool struct {
	size    int
	ready   []*sandbox.Handle // paused, claimable, oldest first
	filling int               // creates in flight
	claims  int64
	retryAt time.Time // after a failed create
}

var (
	_ sandbox.Extension         = (*Keeper)(nil)
	_ sandbox.Provisioner       = (*Keeper)(nil)
	_ sandbox.CreateInterceptor = (*Keeper)(nil)
)

// New returns warm pools, all empty, keeping their sizes in
// cfg.DataDir.
func New(cfg Config) *Keeper {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{file: filepath.Join(cfg.DataDir, "pools.json"), log: log, pools: map[string]*pool{}}
}

// Name implements sandbox.Extension.
func (ps *Keeper) Name() string { return "warmpool" }

// Provision implements sandbox.Provisioner: the pools need the core's
// hidden sandboxes.
func (ps *Keeper) Provision(c sandbox.Core) error {
	hc, ok := c.(sandbox.HiddenCore)
	if !ok {
		return fmt.Errorf("warm pools need a core with hidden sandboxes: %w", errdefs.ErrFailedPrecondition)
	}
	ps.core = hc
	return nil
}

// SetPool sets template name's warm pool size (0 removes the pool),
// persists it and starts filling or trims the pool. The template must
// resolve (a builtin is built on first use).
func (ps *Keeper) SetPool(ctx context.Context, name string, size int) (api.Pool, error) {
	if err := validate.TemplateRef(name); err != nil {
		return api.Pool{}, err
	}
	if size < 0 || size > maxPoolSize {
		return api.Pool{}, fmt.Errorf("pool size must be between 0 and %d: %w", maxPoolSize, errdefs.ErrInvalidArgument)
	}
	if size > 0 {
		if ps.core == nil {
			return api.Pool{}, errNotAttached
		}
		if _, err := ps.core.ResolveTemplate(ctx, name); err != nil {
			return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
		}
	}
	if err := ps.setPoolSize(name, size); err != nil {
		return api.Pool{}, err
	}
	if err := ps.save(); err != nil {
		return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
	}
	ps.log.InfoContext(ctx, "warm pool set", "template", name, "size", size)
	return ps.view(name), nil
}

// SetPools starts the pools at daemon start, once the core has recovered
// its sandboxes (which deletes the pooled sandboxes an earlier daemon
// left): first the sizes set through the API (kept in pools.json), then
// the daemon's configured sizes of the templates the API never set (the
// API's sizes win). Call it once.
func (ps *Keeper) SetPools(ctx context.Context, sizes map[string]int) error {
	saved := ps.load()
	for name, size := range saved {
		if size > 0 && validate.TemplateRef(name) == nil && size <= maxPoolSize {
			_ = ps.setPoolSize(name, size)
		}
	}
	var errs []error
	for name, size := range sizes {
		if _, ok := saved[name]; ok {
			continue
		}
		if size < 0 || size > maxPoolSize || validate.TemplateRef(name) != nil {
			errs = append(errs, fmt.Errorf("warm pool %q size %d: %w", name, size, errdefs.ErrInvalidArgument))
			continue
		}
		errs = append(errs, ps.setPoolSize(name, size))
	}
	return errors.Join(errs...)
}

// Pools lists the warm pools, by template name.
func (ps *Keeper) Pools(ctx context.Context) ([]api.Pool, error) {
	ps.mu.Lock()
	names := slices.Sorted(maps.Keys(ps.pools))
	ps.mu.Unlock()
	out := make([]api.Pool, 0, len(names))
	for _, n := range names {
		out = append(out, ps.view(n))
	}
	return out, nil
}

func (ps *Keeper) view(name string) api.Pool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	v := api.Pool{Template: name}
	if p := ps.pools[name]; p != nil {
		v.Size, v.Ready, v.Filling, v.Claims = p.size, len(p.ready), p.filling, p.claims
	}
	return v
}

var errNotAttached = fmt.Errorf("warm pools are not attached to a sandbox core: %w", errdefs.ErrFailedPrecondition)

// setPoolSize records size and fills or trims the pool.
func (ps *Keeper) setPoolSize(name string, size int) error {
	if ps.core == nil {
		return errNotAttached
	}
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return fmt.Errorf("sandbox manager is shut down: %w", errdefs.ErrUnavailable)
	}
	p := ps.pools[name]
	if p == nil {
		p = &pool{}
		ps.pools[name] = p
	}
	p.size, p.retryAt = size, time.Time{}
	var excess []*sandbox.Handle
	if n := len(p.ready); n > size {
		excess = slices.Clone(p.ready[size:])
		p.ready = p.ready[:size]
	}
	if size == 0 && p.filling == 0 {
		delete(ps.pools, name)
	}
	ps.mu.Unlock()
	for _, h := range excess {
		ps.discard(h, "pool shrunk")
	}
	go ps.fill(name)
	return nil
}

func (ps *Keeper) save() error {
	ps.mu.Lock()
	sizes := make(map[string]int, len(ps.pools))
	for n, p := range ps.pools {
		sizes[n] = p.size
	}
	ps.mu.Unlock()
	for n, s := range ps.load() {
		if _, ok := sizes[n]; !ok && s == 0 {
			sizes[n] = 0 // keep an explicit removal over the daemon config
		}
	}
	data, err := json.Marshal(sizes)
	if err != nil {
		return err
	}
	return renameio.WriteFile(ps.file, data, 0o600)
}

// load reads the sizes set through the API; a missing or unreadable file
// is none.
func (ps *Keeper) load() map[string]int {
	data, err := os.ReadFile(ps.file)
	if err != nil {
		return nil
	}
	var sizes map[string]int
	if err := json.Unmarshal(data, &sizes); err != nil {
		ps.log.Warn("ignoring unreadable pools file", "path", ps.file, "err", err)
		return nil
	}
	return sizes
}

// fill creates pooled sandboxes of template name until its pool is full.
// Concurrent calls share the work.
func (ps *Keeper) fill(name string) {
	ctx := context.Background()
	for {
		ps.mu.Lock()
		p := ps.pools[name]
		if ps.closed || p == nil || len(p.ready)+p.filling >= p.size || time.Now().Before(p.retryAt) {
			ps.mu.Unlock()
			return
		}
		p.filling++
		ps.inflight.Add(1)
		ps.mu.Unlock()

		h, err := ps.create(ctx, name)

		ps.mu.Lock()
		p.filling--
		keep := err == nil && !ps.closed && ps.pools[name] == p && len(p.ready) < p.size
		if keep {
			p.ready = append(p.ready, h)
		}
		if err != nil {
			p.retryAt = time.Now().Add(poolRetry)
			time.AfterFunc(poolRetry, func() { ps.fill(name) })
		}
		if p.size == 0 && p.filling == 0 && ps.pools[name] == p {
			delete(ps.pools, name)
		}
		ps.mu.Unlock()
		if err != nil {
			ps.inflight.Done()
			ps.log.Error("filling warm pool", "template", name, "err", err)
			return
		}
		if !keep {
			ps.discard(h, "pool full or closed")
		}
		ps.inflight.Done()
	}
}

// create creates one paused sandbox for template name's pool.
func (ps *Keeper) create(ctx context.Context, name string) (*sandbox.Handle, error) {
	tmpl, err := ps.core.ResolveTemplate(ctx, name)
	if err != nil {
		return nil, err
	}
	// Its identity is its own from the start: a pooled sandbox is handed
	// out at most once, so an identity written now is as fresh as one
	// written at the claim, and costs the claim nothing.
	return ps.core.CreateHidden(ctx, api.CreateSandboxRequest{Template: name}, tmpl, name, writeIdentity)
}

// discard deletes a pooled sandbox.
func (ps *Keeper) discard(h *sandbox.Handle, why string) {
	if err := ps.core.DeleteHidden(context.Background(), h); err != nil && !errdefs.IsNotFound(err) {
		ps.log.Error("deleting pooled sandbox", "sandbox", h.ID(), "why", why, "err", err)
	}
}

// claimable reports whether a create of req may be served from a pool: it
// asks for nothing a pooled sandbox was not made with.
func claimable(req api.CreateSandboxRequest) bool {
	return req.Resources == (api.Resources{}) && req.Network == nil && req.Hostname == ""
}

// InterceptCreate implements sandbox.CreateInterceptor: it hands out a
// pooled sandbox of req's template, when there is one; ok is false when
// the core must make the sandbox itself.
func (ps *Keeper) InterceptCreate(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool) {
	if !claimable(req) {
		return api.Sandbox{}, false
	}
	for {
		ps.mu.Lock()
		p := ps.pools[tmpl.Name] // the resolved name: a tenant's own template of the same name has no pool
		if ps.closed || p == nil || len(p.ready) == 0 {
			ps.mu.Unlock()
			return api.Sandbox{}, false
		}
		h := p.ready[0]
		p.ready = slices.Delete(p.ready, 0, 1)
		ps.mu.Unlock()

		sb, err := ps.core.HandOut(ctx, h, req, tmpl)
		// Refill after the claim: the new sandbox's start-up must not
		// compete with the claim for the CPU and the store.
		go ps.fill(tmpl.Name)
		if err == nil {
			ps.mu.Lock()
			p.claims++
			ps.mu.Unlock()
			return sb, true
		}
		ps.log.WarnContext(ctx, "pooled sandbox not claimable; discarding", "sandbox", h.ID(), "err", err)
		go ps.discard(h, "claim failed")
	}
}

// DrainPools deletes every pooled sandbox and stops refilling (daemon
// shutdown: pooled sandboxes are not worth keeping for the next daemon).
func (ps *Keeper) DrainPools(ctx context.Context) {
	ps.mu.Lock()
	ps.closed = true
	var all []*sandbox.Handle
	for _, p := range ps.pools {
		all = append(all, p.ready...)
		p.ready = nil
	}
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps.discard(h, "daemon shutting down")
		}()
	}
	wg.Wait()
	// A fill that was creating a sandbox when the pools closed deletes it
	// itself (the pool no longer keeps it): wait for that too, or the
	// sandbox would outlive its daemon unseen.
	ps.inflight.Wait()
}

// writeIdentity writes the identity files (identity.Files) fresh through
// h's running guest,
// concurrently: the pooled sandbox's processes see them like a fresh
// sandbox's.
func writeIdentity(ctx context.Context, h *sandbox.Handle) error {
	g := h.Guest()
	if g == nil {
		return fmt.Errorf("writing identity: sandbox %s has no guest: %w", h.ID(), errdefs.ErrConflict)
	}
	errs := make([]error, len(identity.Files))
	var wg sync.WaitGroup
	for i, f := range identity.Files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = g.WriteFile(ctx, f.Path, uint32(f.Mode), true, bytes.NewReader(f.New()))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("writing identity: %w", err)
	}
	return nil
}
