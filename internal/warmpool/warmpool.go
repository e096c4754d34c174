// Package warmpool keeps warm pools of sandboxes: per template and
// backend (runtime.Backend, by name: "native", "gvisor"), Size sandboxes
// are created ahead of need on that backend with the template's default
// resources and no network, then paused (native: the cgroup freezer;
// gvisor: runsc pause). A create of that template that runs on that
// backend (the one it names, else the template's runtime, else the
// daemon's default: the core resolves it before it asks the pool) and
// asks for nothing a pooled sandbox lacks (default resources, no network
// policy, no hostname) is served from the pool: the sandbox is thawed, the
// request's env, labels, name, lifecycle, idle policy and lifetime are
// set, and its transition log starts over with its create. Its id and
// hostname were allocated when it was pooled (the hostname is set at
// guest setup; nothing inside can change it afterwards), and so were its
// fresh /etc/machine-id and random seed (and, on gvisor, its own sentry:
// a pooled sandbox is paused and thawed, never restored from another's
// memory, so its kernel's random state is its own too). The pool refills
// in the background.
//
// Keeper is an extension of the sandbox core (internal/sandbox): a
// sandbox.CreateInterceptor over the core's hidden sandboxes
// (sandbox.HiddenCore, core_pool.go there). Pooled sandboxes are hidden:
// invisible to every tenant until handed out, and deleted by the core's
// Recover when a daemon restarts (the pools refill fresh). Pool sizes set
// through the API are kept in <data>/pools.json, keyed TEMPLATE:RUNTIME
// (a key without a runtime, written before pools had one, is the pool of
// the backend a create of the template naming none runs on).
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
	"strings"
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

// maxPoolSize bounds one pool.
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
	mu    sync.Mutex
	pools map[key]*pool
	// set holds the sizes set through the API (pools.json), 0 for a pool
	// the API removed (which then stays removed over the daemon's
	// configuration).
	set    map[key]int
	closed bool
}

// key names one pool: a template's on one backend (its resolved name).
type key struct{ template, runtime string }

// String is the key's spelling in pools.json and the daemon's
// configuration: TEMPLATE:RUNTIME.
func (k key) String() string { return k.template + ":" + k.runtime }

// splitKey splits TEMPLATE[:RUNTIME] ("" runtime when none is named).
func splitKey(s string) (template, runtime string) {
	template, runtime, _ = strings.Cut(s, ":")
	return template, runtime
}

// pool is one warm pool.
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
	return &Keeper{file: filepath.Join(cfg.DataDir, "pools.json"), log: log, pools: map[key]*pool{}, set: map[key]int{}}
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

// SetPool sets the size of template name's warm pool on backend rt ("":
// the one a create of the template naming none runs on; 0 removes the
// pool), persists it and starts filling or trims the pool. The template
// must resolve (a builtin is built on first use) and the backend must run
// on this host (errdefs.ErrInvalidArgument for an unknown one,
// ErrFailedPrecondition for one that cannot run here), except to remove a
// pool.
func (ps *Keeper) SetPool(ctx context.Context, name, rt string, size int) (api.Pool, error) {
	if err := validate.TemplateRef(name); err != nil {
		return api.Pool{}, err
	}
	if size < 0 || size > maxPoolSize {
		return api.Pool{}, fmt.Errorf("pool size must be between 0 and %d: %w", maxPoolSize, errdefs.ErrInvalidArgument)
	}
	if ps.core == nil {
		return api.Pool{}, errNotAttached
	}
	if size > 0 {
		if _, err := ps.core.ResolveTemplate(ctx, name); err != nil {
			return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
		}
	}
	resolved, err := ps.core.ResolveRuntime(ctx, name, rt)
	switch {
	case err == nil:
	case size == 0 && rt != "": // removing a pool of a backend gone from this host
		resolved = rt
	default:
		return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
	}
	k := key{name, resolved}
	if err := ps.setPoolSize(k, size); err != nil {
		return api.Pool{}, err
	}
	ps.mu.Lock()
	ps.set[k] = size
	ps.mu.Unlock()
	if err := ps.save(); err != nil {
		return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
	}
	ps.log.InfoContext(ctx, "warm pool set", "template", name, "runtime", resolved, "size", size)
	return ps.view(k), nil
}

// SetPools starts the pools at daemon start, once the core has recovered
// its sandboxes (which deletes the pooled sandboxes an earlier daemon
// left): first the sizes set through the API (kept in pools.json), then
// the daemon's configured sizes, keyed TEMPLATE or TEMPLATE:RUNTIME (no
// runtime: the backend a create of the template naming none runs on), of
// the pools the API never set (the API's sizes win). A configured pool of
// an invalid template name or size, or of a backend that does not run on
// this host, is an error; a saved one is skipped with a warning (and kept
// in pools.json for a daemon that runs its backend). Call it once.
func (ps *Keeper) SetPools(ctx context.Context, sizes map[string]int) error {
	if ps.core == nil {
		return errNotAttached
	}
	saved := ps.load(ctx)
	ps.mu.Lock()
	maps.Copy(ps.set, saved)
	ps.mu.Unlock()
	for k, size := range saved {
		if size <= 0 || size > maxPoolSize || validate.TemplateRef(k.template) != nil {
			continue
		}
		if _, err := ps.core.ResolveRuntime(ctx, k.template, k.runtime); err != nil {
			ps.log.WarnContext(ctx, "not filling a warm pool set through the API", "template", k.template, "runtime", k.runtime, "err", err)
			continue
		}
		_ = ps.setPoolSize(k, size)
	}
	var errs []error
	configured := map[key]int{}
	spelling := map[key]string{}
	for _, spelled := range slices.Sorted(maps.Keys(sizes)) {
		size := sizes[spelled]
		name, rt := splitKey(spelled)
		if size < 0 || size > maxPoolSize || validate.TemplateRef(name) != nil {
			errs = append(errs, fmt.Errorf("warm pool %q size %d: %w", spelled, size, errdefs.ErrInvalidArgument))
			continue
		}
		resolved, err := ps.core.ResolveRuntime(ctx, name, rt)
		if err != nil {
			errs = append(errs, fmt.Errorf("warm pool %q: %w", spelled, err))
			continue
		}
		k := key{name, resolved}
		if other, ok := spelling[k]; ok {
			errs = append(errs, fmt.Errorf("warm pools %q and %q are the same pool: %w", other, spelled, errdefs.ErrInvalidArgument))
			delete(configured, k)
			continue
		}
		configured[k], spelling[k] = size, spelled
	}
	for k, size := range configured {
		if _, ok := saved[k]; !ok {
			errs = append(errs, ps.setPoolSize(k, size))
		}
	}
	return errors.Join(errs...)
}

// Pools lists the warm pools, by template name, then backend.
func (ps *Keeper) Pools(ctx context.Context) ([]api.Pool, error) {
	ps.mu.Lock()
	keys := slices.SortedFunc(maps.Keys(ps.pools), func(a, b key) int {
		return strings.Compare(a.String(), b.String())
	})
	ps.mu.Unlock()
	out := make([]api.Pool, 0, len(keys))
	for _, k := range keys {
		out = append(out, ps.view(k))
	}
	return out, nil
}

func (ps *Keeper) view(k key) api.Pool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	v := api.Pool{Template: k.template, Runtime: k.runtime}
	if p := ps.pools[k]; p != nil {
		v.Size, v.Ready, v.Filling, v.Claims = p.size, len(p.ready), p.filling, p.claims
	}
	return v
}

var errNotAttached = fmt.Errorf("warm pools are not attached to a sandbox core: %w", errdefs.ErrFailedPrecondition)

// setPoolSize records pool k's size and fills or trims the pool.
func (ps *Keeper) setPoolSize(k key, size int) error {
	if ps.core == nil {
		return errNotAttached
	}
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return fmt.Errorf("sandbox manager is shut down: %w", errdefs.ErrUnavailable)
	}
	p := ps.pools[k]
	if p == nil {
		p = &pool{}
		ps.pools[k] = p
	}
	p.size, p.retryAt = size, time.Time{}
	var excess []*sandbox.Handle
	if n := len(p.ready); n > size {
		excess = slices.Clone(p.ready[size:])
		p.ready = p.ready[:size]
	}
	if size == 0 && p.filling == 0 {
		delete(ps.pools, k)
	}
	ps.mu.Unlock()
	for _, h := range excess {
		ps.discard(h, "pool shrunk")
	}
	go ps.fill(k)
	return nil
}

// save writes the sizes set through the API to pools.json.
func (ps *Keeper) save() error {
	ps.mu.Lock()
	sizes := make(map[string]int, len(ps.set))
	for k, n := range ps.set {
		sizes[k.String()] = n
	}
	ps.mu.Unlock()
	data, err := json.Marshal(sizes)
	if err != nil {
		return err
	}
	return renameio.WriteFile(ps.file, data, 0o600)
}

// load reads the sizes set through the API; a missing or unreadable file
// is none. A key without a runtime (a file written before pools had one)
// is the pool of the backend a create of its template naming none runs
// on.
func (ps *Keeper) load(ctx context.Context) map[key]int {
	data, err := os.ReadFile(ps.file)
	if err != nil {
		return nil
	}
	var sizes map[string]int
	if err := json.Unmarshal(data, &sizes); err != nil {
		ps.log.Warn("ignoring unreadable pools file", "path", ps.file, "err", err)
		return nil
	}
	out := make(map[key]int, len(sizes))
	for spelled, n := range sizes {
		name, rt := splitKey(spelled)
		if rt == "" {
			if rt, err = ps.core.ResolveRuntime(ctx, name, ""); err != nil {
				ps.log.Warn("ignoring a saved warm pool", "pool", spelled, "err", err)
				continue
			}
		}
		out[key{name, rt}] = n
	}
	return out
}

// fill creates pooled sandboxes of pool k until it is full. Concurrent
// calls share the work.
func (ps *Keeper) fill(k key) {
	ctx := context.Background()
	for {
		ps.mu.Lock()
		p := ps.pools[k]
		if ps.closed || p == nil || len(p.ready)+p.filling >= p.size || time.Now().Before(p.retryAt) {
			ps.mu.Unlock()
			return
		}
		p.filling++
		ps.inflight.Add(1)
		ps.mu.Unlock()

		h, err := ps.create(ctx, k)

		ps.mu.Lock()
		p.filling--
		keep := err == nil && !ps.closed && ps.pools[k] == p && len(p.ready) < p.size
		if keep {
			p.ready = append(p.ready, h)
		}
		if err != nil {
			p.retryAt = time.Now().Add(poolRetry)
			time.AfterFunc(poolRetry, func() { ps.fill(k) })
		}
		if p.size == 0 && p.filling == 0 && ps.pools[k] == p {
			delete(ps.pools, k)
		}
		ps.mu.Unlock()
		if err != nil {
			ps.inflight.Done()
			ps.log.Error("filling warm pool", "template", k.template, "runtime", k.runtime, "err", err)
			return
		}
		if !keep {
			ps.discard(h, "pool full or closed")
		}
		ps.inflight.Done()
	}
}

// create creates one paused sandbox for pool k, on its backend.
func (ps *Keeper) create(ctx context.Context, k key) (*sandbox.Handle, error) {
	tmpl, err := ps.core.ResolveTemplate(ctx, k.template)
	if err != nil {
		return nil, err
	}
	// Its identity is its own from the start: a pooled sandbox is handed
	// out at most once, so an identity written now is as fresh as one
	// written at the claim, and costs the claim nothing.
	req := api.CreateSandboxRequest{Template: k.template, Runtime: k.runtime}
	return ps.core.CreateHidden(ctx, req, tmpl, k.String(), writeIdentity)
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
// pooled sandbox of req's template on req's backend (req.Runtime,
// resolved by the core), when there is one; ok is false when the core
// must make the sandbox itself.
func (ps *Keeper) InterceptCreate(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool) {
	if !claimable(req) || req.Runtime == "" {
		return api.Sandbox{}, false
	}
	// The resolved template name: a tenant's own template of the same
	// name has no pool. The resolved backend: a create that asks for one
	// backend's isolation never gets another's sandbox.
	k := key{tmpl.Name, req.Runtime}
	for {
		ps.mu.Lock()
		p := ps.pools[k]
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
		go ps.fill(k)
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
