package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/validate"
)

// Limits on what a create request may ask for.
const (
	maxCPUs        = 1024
	maxTimeout     = 30 * 24 * time.Hour
	guestReadyWait = 30 * time.Second
)

var (
	hostnameRE = lazyregexp.New(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	idRE       = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,63}$`)
)

func validateCreate(req *api.CreateSandboxRequest) error {
	if req.Template != "" {
		if err := validate.TemplateRef(req.Template); err != nil {
			return err
		}
	}
	if err := validate.Env(req.Env); err != nil {
		return err
	}
	if err := validate.Labels(req.Labels); err != nil {
		return err
	}
	r := req.Resources
	if r.CPUs < 0 || r.CPUs > maxCPUs || r.MemoryBytes < 0 || r.PidsMax < 0 {
		return fmt.Errorf("resources must be non-negative and cpus at most %d: %w", maxCPUs, errdefs.ErrInvalidArgument)
	}
	if r.MemoryBytes != 0 && r.MemoryBytes < 8<<20 {
		return fmt.Errorf("memory_bytes must be at least 8 MiB: %w", errdefs.ErrInvalidArgument)
	}
	if r.PidsMax != 0 && r.PidsMax < 8 {
		return fmt.Errorf("pids_max must be at least 8: %w", errdefs.ErrInvalidArgument)
	}
	if req.TimeoutSeconds < 0 || time.Duration(req.TimeoutSeconds)*time.Second > maxTimeout {
		return fmt.Errorf("timeout_seconds must be between 0 and %d: %w", int64(maxTimeout/time.Second), errdefs.ErrInvalidArgument)
	}
	if req.Hostname != "" && !hostnameRE.MatchString(req.Hostname) {
		return fmt.Errorf("hostname %q is not valid: %w", req.Hostname, errdefs.ErrInvalidArgument)
	}
	return nil
}

// createSandbox creates and starts a sandbox from a template. It returns
// once the sandbox's guest answers, so the first exec needs no retry. On
// error nothing of the sandbox is left behind. req.Lifecycle and req.Idle
// are already resolved (CreateOrGetSandbox).
func (m *Manager) createSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	if err := validateCreate(&req); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	if err := m.prepare(ctx, &req); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
	}
	tmpl, err := m.template(ctx, req.Template)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	disk, release, err := m.admitSandboxes(ctx, tenant.From(ctx).Tenant, 1, req.Resources.DiskBytes)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	defer release()
	req.Resources.DiskBytes = disk
	// The backend is resolved before an interceptor sees the request: it
	// serves a sandbox of that backend or none.
	if _, err := m.resolveRuntime(&req); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	if sb, ok := m.intercept(ctx, req, tmpl); ok {
		return sb, nil
	}
	return m.createFrom(ctx, req, tmpl, "")
}

// createFrom creates a sandbox of the resolved template tmpl; hidden names
// the holder of a hidden sandbox (core_pool.go), "" for a sandbox handed
// out at once.
func (m *Manager) createFrom(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template, hidden string) (api.Sandbox, error) {
	if _, err := m.resolveRuntime(&req); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	res, err := m.resolveResources(req.Resources, tmpl)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	if err := m.checkDiskPolicy(tenant.From(ctx).Tenant, res); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	env := cloneMap(tmpl.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range req.Env {
		env[k] = v
	}

	id := newID()
	hostname := req.Hostname
	if hostname == "" {
		hostname = id
	}
	now := time.Now().UTC()
	sb := api.Sandbox{
		ID:         id,
		Tenant:     tenant.From(ctx).Tenant,
		Template:   req.Template,
		TemplateID: tmpl.ID,
		State:      api.StateCreating,
		Env:        env,
		Labels:     cloneMap(req.Labels),
		Resources:  res,
		Hostname:   hostname,
		Backend:    req.Runtime,
		CreatedAt:  now,
		Network:    req.Network,
		Name:       req.Name,
		Lifecycle:  req.Lifecycle,
		Idle:       req.Idle,
	}
	if req.TimeoutSeconds > 0 {
		exp := now.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		sb.ExpiresAt = &exp
	}
	p := m.paths(id)
	rec := store.SandboxRecord{
		Sandbox:    sb,
		Layers:     append([]string(nil), tmpl.Layers...),
		UpperDir:   p.upper,
		WorkDir:    p.work,
		SocketPath: p.socket,
		StateDir:   p.state,
	}
	if hidden != "" {
		setHidden(&rec, hidden)
	}
	b, err := m.start(ctx, rec, true)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.onCreate(ctx, b); err != nil {
		_ = m.DeleteSandbox(context.WithoutCancel(ctx), id)
		m.observeBoxSince(ctx, OpCreate, b, req.Template, now, err)
		return api.Sandbox{}, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	m.observeBoxSince(ctx, OpCreate, b, req.Template, now, nil)
	m.log.InfoContext(ctx, "sandbox created", "sandbox", id, "template", req.Template)
	return b.view(), nil
}

// template resolves a template (NAME or NAME@VERSION) as the caller of
// ctx sees it — its own templates first, then the admin's catalogue —
// building a builtin one on first use.
func (m *Manager) template(ctx context.Context, name string) (templates.Template, error) {
	return templates.Resolve(ctx, m.templates, tenant.From(ctx).Lookup(name, true), name, m.log)
}

// start prepares the sandbox's directories (when fresh), starts its guest,
// persists its record and registers it. On error everything it did is undone.
func (m *Manager) start(ctx context.Context, rec store.SandboxRecord, fresh bool) (*box, error) {
	return m.startFrom(ctx, rec, fresh, "")
}

// startFrom is start, with the processes restored from the memory image in
// dir when it is not "" (createOrRestore).
func (m *Manager) startFrom(ctx context.Context, rec store.SandboxRecord, fresh bool, image string) (_ *box, err error) {
	id := rec.Sandbox.ID
	p := m.paths(id)
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	be, err := m.backendOf(rec)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	rec.Sandbox.Backend = be.Capabilities().Name
	// First, so undone last: after the guest and the sandbox dir are gone.
	release, err := m.assignIDs(&rec, be)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	if release != nil {
		undo = append(undo, release)
	}
	if fresh {
		remove, err := m.makeSandboxDir(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
		}
		undo = append(undo, remove)
	}
	if err := os.MkdirAll(p.state, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: creating state dir: %w", id, err)
	}
	spec := m.runtimeSpec(rec)
	rt, err := createOrRestore(ctx, be, spec, image)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		if derr := rt.Destroy(context.WithoutCancel(ctx)); derr != nil {
			m.log.Error("destroying half-created sandbox", "sandbox", id, "err", derr)
		}
	})
	// The backend returns once the guest listens, so no round trip is
	// needed before the first call. The guest is the runner copy of this
	// daemon's binary: its version is ours plus that binary's build (what
	// the guest itself reports; restarts and upgrades ask it).
	guest := client.New(rt.SocketPath())
	if rec.Sandbox.Runner == "" {
		rec.Sandbox.Runner = m.defaultRunner()
	}
	if rec.Sandbox.Runner == m.defaultRunner() {
		rec.Sandbox.GuestVersion = m.defaultGuestVersion()
	}
	rec.Sandbox.State = api.StateRunning
	rec.RuntimeState = rt.State()
	rec.UpdatedAt = time.Now().UTC()
	addTransition(&rec, api.Transition{From: api.StateCreating, To: api.StateRunning, Cause: api.CauseCreate, At: m.cfg.Clock.Now().UTC()})
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: saving record: %w", id, err)
	}
	b := &box{guest: guest, rec: rec, rt: rt, hidden: hiddenOf(rec)}
	if err := m.register(b); err != nil {
		_ = m.store.DeleteSandbox(context.WithoutCancel(ctx), id)
		return nil, err
	}
	m.observeTransition(ctx, b)
	return b, nil
}

func (m *Manager) runtimeSpec(rec store.SandboxRecord) runtime.Spec {
	r := rec.Sandbox.Resources
	return runtime.Spec{
		ID:         rec.Sandbox.ID,
		Layers:     rec.Layers,
		UpperDir:   rec.UpperDir,
		WorkDir:    rec.WorkDir,
		RunnerDir:  m.runnerDir(rec),
		SocketPath: rec.SocketPath,
		StateDir:   rec.StateDir,
		Hostname:   rec.Sandbox.Hostname,
		LayerIDs:   m.cfg.IDs,
		UIDMap:     m.idsOf(rec),
		GIDMap:     m.idsOf(rec),
		Resources:  runtime.Resources{CPUs: r.CPUs, MemoryBytes: r.MemoryBytes, PidsMax: r.PidsMax, OpenFiles: r.OpenFiles},
	}
}

// register adds b to the table and starts its watchers (expiry, idle
// policy, guest exit). A hibernated sandbox (no runtime) has no guest to
// watch.
func (m *Manager) register(b *box) error {
	id := b.rec.Sandbox.ID
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("sandbox manager is shut down: %w", errdefs.ErrUnavailable)
	}
	m.sandboxes[id] = b
	b.mu.Lock()
	m.startTimersLocked(b)
	rt := b.rt
	b.mu.Unlock()
	if rt != nil {
		go m.watch(b, rt)
	}
	return nil
}

// watch marks the sandbox stopped when its guest exits on its own. A guest
// replaced meanwhile (restore) is not the sandbox's any more: its exit is
// ignored. rt is b's runtime when the watch starts.
func (m *Manager) watch(b *box, rt runtime.Sandbox) {
	<-rt.Wait()
	b.mu.Lock()
	deleted := b.deleted || b.rt != rt
	if !deleted {
		m.setStateLocked(b, api.StateStopped, api.CauseGuestExit, "")
	}
	rec := b.rec
	b.mu.Unlock()
	if deleted {
		return
	}
	m.onStop(context.Background(), b, api.StateStopped)
	m.log.Warn("sandbox guest exited", "sandbox", rec.Sandbox.ID)
	rec.UpdatedAt = time.Now().UTC()
	if err := m.store.PutSandbox(context.Background(), rec); err != nil {
		m.log.Error("saving sandbox record", "sandbox", rec.Sandbox.ID, "err", err)
	}
}

// DeleteSandbox destroys a sandbox: every process is killed, its cgroups,
// socket and writable layer are removed and its record is deleted. Streams
// attached to it end. Deleting is idempotent only in effect: a second call
// returns ErrNotFound.
func (m *Manager) DeleteSandbox(ctx context.Context, id string) error {
	b, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	b.life.Lock()
	defer b.life.Unlock()
	return m.deleteLocked(ctx, b, api.CauseAPI)
}

// deleteLocked does DeleteSandbox with b.life held exclusively; cause goes
// to the log (the record, with its transitions, is gone afterwards).
func (m *Manager) deleteLocked(ctx context.Context, b *box, cause string) error {
	ctx = context.WithoutCancel(ctx)
	b.mu.Lock()
	id := b.rec.Sandbox.ID
	if b.deleted {
		b.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	b.deleted = true
	from := b.rec.Sandbox.State
	b.rec.Sandbox.State = api.StateDeleting
	if b.expiry != nil {
		b.expiry.Stop()
	}
	b.stopIdleLocked()
	rt, rec := b.rt, b.rec
	b.mu.Unlock()
	// The intent is persisted first: a daemon that dies mid-delete
	// finishes the delete at start-up (Recover reaps a deleting record)
	// instead of adopting a half-destroyed sandbox.
	rec.UpdatedAt = time.Now().UTC()
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		m.log.WarnContext(ctx, "recording delete intent", "sandbox", id, "err", err)
	}

	var errs []error
	if rt != nil {
		if err := rt.Destroy(ctx); err != nil {
			errs = append(errs, fmt.Errorf("destroying: %w", err))
		}
	} else if err := m.cleanupRuntime(ctx, rec); err != nil {
		// Hibernated (or failed): no guest runs; clear any leftovers.
		errs = append(errs, fmt.Errorf("cleaning up: %w", err))
	}
	if err := m.removeDisk(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(m.paths(id).dir); err != nil {
		errs = append(errs, fmt.Errorf("removing sandbox dir: %w", err))
	} else if len(errs) == 0 {
		m.releaseIDs(m.idsOf(rec)) // no process, no file of it is left
	}
	if err := m.store.DeleteSandbox(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("deleting record: %w", err))
	}
	m.releaseLayers(ctx, id)
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.mu.Unlock()
	m.onDelete(ctx, id)
	err := errors.Join(errs...)
	m.observeBox(ctx, OpDelete, b, cause, err)
	if err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	m.log.InfoContext(ctx, "sandbox deleted", "sandbox", id, "from", from, "cause", cause)
	return nil
}

// acquire returns the running sandbox id with its lifecycle lock held shared
// and counts a call in progress (the sandbox is not idle until release); the
// caller must call release. A paused or hibernated sandbox is woken first:
// this is the single entry of every exec, file and attach call, so every
// call wakes a sleeping sandbox transparently.
func (m *Manager) acquire(ctx context.Context, id string) (*box, func(), error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		b.life.RLock()
		b.mu.Lock()
		state, deleted := b.rec.Sandbox.State, b.deleted
		if !deleted && state == api.StateRunning {
			b.lc.active++
			b.stopIdleLocked()
		}
		b.mu.Unlock()
		if deleted {
			b.life.RUnlock()
			return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if state == api.StateRunning {
			return b, func() {
				m.idleFrom(b)
				b.life.RUnlock()
			}, nil
		}
		b.life.RUnlock()
		if !asleep(state) || attempt >= 3 {
			return nil, nil, fmt.Errorf("sandbox %s is %s: %w", id, state, errdefs.ErrConflict)
		}
		if err := m.wake(context.Background(), b, api.CauseWake, "call"); err != nil {
			return nil, nil, err
		}
	}
}
