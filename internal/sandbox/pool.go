package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Warm pools: per template, Size sandboxes are created ahead of need with
// the template's default resources and no network, then paused. A create
// of that template that asks for nothing a pooled sandbox lacks (default
// resources, no network policy, no hostname) claims one: it is thawed, a
// fresh /etc/machine-id and random seed are written through its guest,
// the request's env, labels, name, lifecycle, idle policy and lifetime are
// set, and its transition log starts over with its create. Its id and
// hostname were allocated when it was pooled (the hostname is set at guest
// setup; nothing inside can change it afterwards). The pool refills in the
// background.
//
// Pooled sandboxes are ordinary boxes in the Manager's table whose pool
// field is set: get (every API entry) and ListSandboxes skip them, so they
// are invisible until claimed; their record carries the pool (recordExtra)
// so a restarted daemon deletes them and refills. Pool sizes set through
// the API are kept in <data>/pools.json.

// maxPoolSize bounds one template's pool.
const maxPoolSize = 64

// poolRetry is how long a pool whose create failed waits before it tries
// again.
const poolRetry = 5 * time.Second

// poolState is the Manager's warm pools.
type poolState struct {
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
	ready   []*box // paused, claimable, oldest first
	filling int    // creates in flight
	claims  int64
	retryAt time.Time // after a failed create
}

func (b *box) pooled() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pool != ""
}

func (m *Manager) poolsFile() string { return filepath.Join(m.cfg.DataDir, "pools.json") }

// SetPool sets template name's warm pool size (0 removes the pool),
// persists it and starts filling or trims the pool. The template must
// resolve (a builtin is built on first use).
func (m *Manager) SetPool(ctx context.Context, name string, size int) (api.Pool, error) {
	if !templateRE.MatchString(name) {
		return api.Pool{}, fmt.Errorf("template name %q is not valid: %w", name, errdefs.ErrInvalidArgument)
	}
	if size < 0 || size > maxPoolSize {
		return api.Pool{}, fmt.Errorf("pool size must be between 0 and %d: %w", maxPoolSize, errdefs.ErrInvalidArgument)
	}
	if size > 0 {
		if _, err := m.template(ctx, name); err != nil {
			return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
		}
	}
	if err := m.setPoolSize(name, size); err != nil {
		return api.Pool{}, err
	}
	if err := m.savePools(); err != nil {
		return api.Pool{}, fmt.Errorf("setting pool of template %s: %w", name, err)
	}
	m.log.InfoContext(ctx, "warm pool set", "template", name, "size", size)
	return m.poolView(name), nil
}

// SetPools applies the daemon's configured pool sizes (before any set
// through the API, which win; see Recover).
func (m *Manager) SetPools(ctx context.Context, sizes map[string]int) error {
	saved := m.loadPools()
	var errs []error
	for name, size := range sizes {
		if _, ok := saved[name]; ok {
			continue
		}
		if size < 0 || size > maxPoolSize || !templateRE.MatchString(name) {
			errs = append(errs, fmt.Errorf("warm pool %q size %d: %w", name, size, errdefs.ErrInvalidArgument))
			continue
		}
		errs = append(errs, m.setPoolSize(name, size))
	}
	return errors.Join(errs...)
}

// Pools lists the warm pools, by template name.
func (m *Manager) Pools(ctx context.Context) ([]api.Pool, error) {
	m.pools.mu.Lock()
	names := slices.Sorted(maps.Keys(m.pools.pools))
	m.pools.mu.Unlock()
	out := make([]api.Pool, 0, len(names))
	for _, n := range names {
		out = append(out, m.poolView(n))
	}
	return out, nil
}

func (m *Manager) poolView(name string) api.Pool {
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	v := api.Pool{Template: name}
	if p := m.pools.pools[name]; p != nil {
		v.Size, v.Ready, v.Filling, v.Claims = p.size, len(p.ready), p.filling, p.claims
	}
	return v
}

// setPoolSize records size and fills or trims the pool.
func (m *Manager) setPoolSize(name string, size int) error {
	m.pools.mu.Lock()
	if m.pools.closed {
		m.pools.mu.Unlock()
		return fmt.Errorf("sandbox manager is shut down: %w", errdefs.ErrUnavailable)
	}
	if m.pools.pools == nil {
		m.pools.pools = map[string]*pool{}
	}
	p := m.pools.pools[name]
	if p == nil {
		p = &pool{}
		m.pools.pools[name] = p
	}
	p.size, p.retryAt = size, time.Time{}
	var excess []*box
	if n := len(p.ready); n > size {
		excess = slices.Clone(p.ready[size:])
		p.ready = p.ready[:size]
	}
	if size == 0 && p.filling == 0 {
		delete(m.pools.pools, name)
	}
	m.pools.mu.Unlock()
	for _, b := range excess {
		m.discardPooled(b, "pool shrunk")
	}
	go m.fillPool(name)
	return nil
}

func (m *Manager) savePools() error {
	m.pools.mu.Lock()
	sizes := make(map[string]int, len(m.pools.pools))
	for n, p := range m.pools.pools {
		sizes[n] = p.size
	}
	m.pools.mu.Unlock()
	for n, s := range m.loadPools() {
		if _, ok := sizes[n]; !ok && s == 0 {
			sizes[n] = 0 // keep an explicit removal over the daemon config
		}
	}
	data, err := json.Marshal(sizes)
	if err != nil {
		return err
	}
	return renameio.WriteFile(m.poolsFile(), data, 0o600)
}

// loadPools reads the sizes set through the API; a missing or unreadable
// file is none.
func (m *Manager) loadPools() map[string]int {
	data, err := os.ReadFile(m.poolsFile())
	if err != nil {
		return nil
	}
	var sizes map[string]int
	if err := json.Unmarshal(data, &sizes); err != nil {
		m.log.Warn("ignoring unreadable pools file", "path", m.poolsFile(), "err", err)
		return nil
	}
	return sizes
}

// recoverPools deletes the pooled sandboxes an earlier daemon left (they
// are refilled fresh) and restores the pool sizes set through the API.
func (m *Manager) recoverPools(ctx context.Context) {
	m.mu.Lock()
	var stale []*box
	for _, b := range m.sandboxes {
		if x := extraOf(b.rec); x.Pool != "" {
			stale = append(stale, b)
		}
	}
	m.mu.Unlock()
	for _, b := range stale {
		b.life.Lock()
		if err := m.deleteLocked(ctx, b, api.CauseRecover); err != nil && !errdefs.IsNotFound(err) {
			m.log.ErrorContext(ctx, "deleting pooled sandbox of an earlier daemon", "sandbox", b.rec.Sandbox.ID, "err", err)
		}
		b.life.Unlock()
	}
	for name, size := range m.loadPools() {
		if size > 0 && templateRE.MatchString(name) && size <= maxPoolSize {
			_ = m.setPoolSize(name, size)
		}
	}
}

// fillPool creates pooled sandboxes of template name until its pool is
// full. Concurrent calls share the work.
func (m *Manager) fillPool(name string) {
	ctx := context.Background()
	for {
		m.pools.mu.Lock()
		p := m.pools.pools[name]
		if m.pools.closed || p == nil || len(p.ready)+p.filling >= p.size || time.Now().Before(p.retryAt) {
			m.pools.mu.Unlock()
			return
		}
		p.filling++
		m.pools.inflight.Add(1)
		m.pools.mu.Unlock()

		b, err := m.createPooled(ctx, name)

		m.pools.mu.Lock()
		p.filling--
		keep := err == nil && !m.pools.closed && m.pools.pools[name] == p && len(p.ready) < p.size
		if keep {
			p.ready = append(p.ready, b)
		}
		if err != nil {
			p.retryAt = time.Now().Add(poolRetry)
			time.AfterFunc(poolRetry, func() { m.fillPool(name) })
		}
		if p.size == 0 && p.filling == 0 && m.pools.pools[name] == p {
			delete(m.pools.pools, name)
		}
		m.pools.mu.Unlock()
		if err != nil {
			m.pools.inflight.Done()
			m.log.Error("filling warm pool", "template", name, "err", err)
			return
		}
		if !keep {
			m.discardPooled(b, "pool full or closed")
		}
		m.pools.inflight.Done()
	}
}

// createPooled creates one paused sandbox for template name's pool.
func (m *Manager) createPooled(ctx context.Context, name string) (*box, error) {
	tmpl, err := m.template(ctx, name)
	if err != nil {
		return nil, err
	}
	sb, err := m.createFrom(ctx, api.CreateSandboxRequest{Template: name}, tmpl, name)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	b := m.sandboxes[sb.ID]
	m.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("pooled sandbox %s vanished: %w", sb.ID, errdefs.ErrNotFound)
	}
	// Its identity is its own from the start: a pooled sandbox is handed
	// out at most once, so an identity written now is as fresh as one
	// written at the claim, and costs the claim nothing.
	if err := writeIdentityLive(ctx, b.guest); err != nil {
		m.discardPooled(b, "identity")
		return nil, fmt.Errorf("writing identity: %w", err)
	}
	b.life.Lock()
	err = m.pauseLocked(ctx, b, api.CausePool, "")
	b.life.Unlock()
	if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) { // a backend that cannot freeze keeps it running
		m.discardPooled(b, "pause failed")
		return nil, err
	}
	return b, nil
}

// discardPooled deletes a pooled sandbox.
func (m *Manager) discardPooled(b *box, why string) {
	b.life.Lock()
	defer b.life.Unlock()
	if err := m.deleteLocked(context.Background(), b, api.CausePool); err != nil && !errdefs.IsNotFound(err) {
		m.log.Error("deleting pooled sandbox", "sandbox", b.rec.Sandbox.ID, "why", why, "err", err)
	}
}

// claimable reports whether a create of req may be served from a pool: it
// asks for nothing a pooled sandbox was not made with.
func claimable(req api.CreateSandboxRequest) bool {
	return req.Resources == (api.Resources{}) && req.Network == nil && req.Hostname == ""
}

// claim hands out a pooled sandbox of req's template, when there is one;
// ok is false when the create must make a sandbox itself.
func (m *Manager) claim(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool) {
	if !claimable(req) {
		return api.Sandbox{}, false
	}
	for {
		m.pools.mu.Lock()
		p := m.pools.pools[tmpl.Name] // the resolved name: a tenant's own template of the same name has no pool
		if m.pools.closed || p == nil || len(p.ready) == 0 {
			m.pools.mu.Unlock()
			return api.Sandbox{}, false
		}
		b := p.ready[0]
		p.ready = slices.Delete(p.ready, 0, 1)
		m.pools.mu.Unlock()

		sb, err := m.claimBox(ctx, b, req, tmpl)
		// Refill after the claim: the new sandbox's start-up must not
		// compete with the claim for the CPU and the store.
		go m.fillPool(tmpl.Name)
		if err == nil {
			m.pools.mu.Lock()
			p.claims++
			m.pools.mu.Unlock()
			return sb, true
		}
		m.log.WarnContext(ctx, "pooled sandbox not claimable; discarding", "sandbox", b.rec.Sandbox.ID, "err", err)
		go m.discardPooled(b, "claim failed")
	}
}

// claimBox makes pooled sandbox b the sandbox req asked for.
func (m *Manager) claimBox(ctx context.Context, b *box, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	state, deleted, rt, id, tid := b.rec.Sandbox.State, b.deleted, b.rt, b.rec.Sandbox.ID, b.rec.Sandbox.TemplateID
	b.mu.Unlock()
	switch {
	case deleted:
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	case tid != tmpl.ID:
		return api.Sandbox{}, fmt.Errorf("pooled from template %s, now %s: %w", tid, tmpl.ID, errdefs.ErrConflict)
	case state == api.StatePaused:
		p, ok := rt.(runtime.Pauser)
		if !ok {
			return api.Sandbox{}, fmt.Errorf("backend cannot thaw: %w", errdefs.ErrFailedPrecondition)
		}
		if err := p.Resume(ctx); err != nil {
			return api.Sandbox{}, err
		}
	case state != api.StateRunning:
		return api.Sandbox{}, fmt.Errorf("pooled sandbox is %s: %w", state, errdefs.ErrConflict)
	}
	thawed := time.Since(start)

	env := cloneMap(tmpl.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range req.Env {
		env[k] = v
	}
	now := m.cfg.Clock.Now().UTC()
	b.mu.Lock()
	sb := &b.rec.Sandbox
	sb.Tenant = tenant.From(ctx).Tenant
	sb.Template, sb.Env, sb.Labels = req.Template, env, cloneMap(req.Labels)
	sb.Name, sb.Lifecycle, sb.Idle = req.Name, req.Lifecycle, req.Idle
	sb.CreatedAt, sb.State, sb.ExpiresAt = time.Now().UTC(), api.StateRunning, nil
	if req.TimeoutSeconds > 0 {
		exp := now.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		sb.ExpiresAt = &exp
	}
	b.rec.TTLLeft = 0
	b.rec.Transitions = nil
	addTransition(&b.rec, api.Transition{From: api.StateCreating, To: api.StateRunning, Cause: api.CauseCreate, Detail: "warm pool", At: now})
	x := extraOf(b.rec)
	x.Pool = ""
	setExtra(&b.rec, x)
	b.pool = ""
	b.lc.lastActive = m.cfg.Clock.Now()
	m.scheduleTTLLocked(b)
	m.scheduleIdleLocked(b)
	b.mu.Unlock()
	if err := m.saveLocked(ctx, b); err != nil {
		// Handed out in memory but not on disk: delete rather than lose
		// it silently at the next start.
		_ = m.deleteLocked(ctx, b, api.CauseError)
		return api.Sandbox{}, err
	}
	m.observeTransition(ctx, b)
	m.observeBox(ctx, OpCreate, b, req.Template, nil)
	m.log.InfoContext(ctx, "sandbox created from warm pool", "sandbox", id, "template", req.Template,
		"thawed", thawed, "took", time.Since(start))
	return b.view(), nil
}

// writeIdentityLive writes identityFiles (fork.go) through a running
// guest, concurrently: the pooled sandbox's processes see them like a
// fresh sandbox's.
func writeIdentityLive(ctx context.Context, g *client.Client) error {
	errs := make([]error, len(identityFiles))
	var wg sync.WaitGroup
	for i, f := range identityFiles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = g.WriteFile(ctx, "/"+f.path, uint32(f.mode), true, bytes.NewReader(f.data()))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// DrainPools deletes every pooled sandbox and stops refilling (daemon
// shutdown: pooled sandboxes are not worth keeping for the next daemon).
func (m *Manager) DrainPools(ctx context.Context) {
	m.pools.mu.Lock()
	m.pools.closed = true
	var all []*box
	for _, p := range m.pools.pools {
		all = append(all, p.ready...)
		p.ready = nil
	}
	m.pools.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.discardPooled(b, "daemon shutting down")
		}()
	}
	wg.Wait()
	// A fill that was creating a sandbox when the pools closed deletes it
	// itself (the pool no longer keeps it): wait for that too, or the
	// sandbox would outlive its daemon unseen.
	m.pools.inflight.Wait()
}
