package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Hidden sandboxes: what a warm pool (internal/warmpool) needs from the
// core.
//
// A hidden sandbox is an ordinary sandbox of the core's table that no
// tenant can see: every lookup by id (and so every API call naming it),
// ListSandboxes and tenancy admission (Holdings) skip it, exactly as if it
// did not exist. It is made ahead of need, set up and paused by
// CreateHidden, and is either handed out, once, to a create request
// (HandOut), after which it is an ordinary sandbox, or deleted
// (DeleteHidden). Its record names its holder, so a hidden sandbox never
// outlives its daemon: Recover deletes those an earlier daemon left.
//
// Scenario, a warm pool:
//
//  1. The pool fills: CreateHidden on the pool's backend (req.Runtime,
//     ResolveRuntime), with the pool's own set-up step (fresh identity
//     files through h.Guest()) before the sandbox is paused.
//  2. A create request arrives: the core validates and prepares it,
//     resolves its template and its backend and admits it against its
//     tenant's quotas, then asks each CreateInterceptor, in registration
//     order, whether it can supply the sandbox; the pool of that template
//     and backend takes one of its sandboxes and calls HandOut, which
//     refuses a sandbox of another backend. The first interceptor that
//     answers wins; when none does the core creates the sandbox itself.
//  3. The pool shrinks or the daemon stops: DeleteHidden.

// CreateInterceptor is an Extension that may serve a create request with
// a sandbox it holds hidden (a warm pool).
type CreateInterceptor interface {
	// InterceptCreate is asked, for every create request (not a fork),
	// after the request is validated and prepared (PrepareHook), its
	// template tmpl resolved as the caller of ctx sees it, its backend
	// resolved (req.Runtime is the name of the backend the sandbox must
	// run on, never ""), and the sandbox admitted against the caller's
	// quotas, whether it supplies the sandbox, which must run on
	// req.Runtime (HandOut refuses one of another backend). It returns
	// the sandbox (made by HiddenCore.HandOut) and true, or false when
	// the core must create the sandbox itself; it cannot fail the create.
	// It runs without any sandbox's lock held and may be called
	// concurrently.
	InterceptCreate(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool)
}

// HiddenCore is the part of the core that makes and hands out hidden
// sandboxes. *Manager implements it; an extension gets it by asserting the
// Core its Provision receives. Its methods are safe for concurrent use.
type HiddenCore interface {
	Core
	// ResolveTemplate resolves template name (NAME or NAME@VERSION) as the
	// caller of ctx sees it, building a builtin one on first use.
	ResolveTemplate(ctx context.Context, name string) (templates.Template, error)
	// ResolveRuntime is the name of the backend a create of template
	// name ("": the default template), as the caller of ctx sees it,
	// asking for backend asked ("": none) runs on: asked, else the
	// template's runtime (api.TemplateSpec.Runtime), else the daemon's
	// default. It builds nothing: a template not built yet names the
	// runtime of its builtin spec (none), a template that does not exist
	// none. The error is errdefs.ErrInvalidArgument for a backend this
	// daemon does not know, errdefs.ErrFailedPrecondition for one that
	// cannot run on this host.
	ResolveRuntime(ctx context.Context, template, asked string) (string, error)
	// CreateHidden creates a hidden sandbox of template tmpl as req asks
	// (its backend, resources, environment, hostname), recorded as held
	// by holder (not ""); then it runs setup (nil: none) on the running
	// sandbox, without its lock held (no one else can reach it), and
	// pauses it (cause api.CausePool) unless the backend cannot freeze,
	// which leaves it running. Nothing admits it against a tenant's quotas and no
	// PrepareHook sees req; the start and create hooks run as for any
	// create. On error (setup's included) nothing of it is left.
	CreateHidden(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template, holder string, setup func(context.Context, *Handle) error) (*Handle, error)
	// DeleteHidden deletes hidden sandbox h (cause api.CausePool), on a
	// context without cancellation. A second call, or a call for a sandbox
	// that was handed out, is ErrNotFound.
	DeleteHidden(ctx context.Context, h *Handle) error
	// HandOut makes hidden sandbox h the sandbox create request req of
	// the caller of ctx asked for, of template tmpl: thawed when paused,
	// owned by the caller, with tmpl's environment under req's, req's
	// labels, name, lifecycle, idle policy and lifetime, and a transition
	// log that starts over with its create (detail "warm pool"); its
	// timers are armed and it is visible from then on. h must have been
	// made from tmpl (same template id) and run on the backend req asks
	// for (req.Runtime, "": the default): ErrConflict otherwise; a sandbox
	// deleted or already handed out is ErrNotFound. On error h is not
	// handed out (it may have been deleted) and the caller should discard
	// it.
	HandOut(ctx context.Context, h *Handle, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, error)
}

var _ HiddenCore = (*Manager)(nil)

// hiddenOf is the holder of the sandbox rec describes, "" when it is not
// hidden.
func hiddenOf(rec store.SandboxRecord) string { return extraOf(rec).Pool }

// setHidden records holder ("" for none) in rec.
func setHidden(rec *store.SandboxRecord, holder string) {
	x := extraOf(*rec)
	x.Pool = holder
	setExtra(rec, x)
}

// isHidden reports whether b is hidden (not handed out yet).
func (b *box) isHidden() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hidden != ""
}

// intercept asks the create interceptors whether one supplies the sandbox
// req asks for. req.Runtime is resolved (createSandbox): an interceptor
// supplies a sandbox of that backend or none, and HandOut refuses a hidden
// sandbox of another.
func (m *Manager) intercept(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool) {
	for _, x := range m.hooks.intercept {
		if sb, ok := x.h.InterceptCreate(ctx, req, tmpl); ok {
			return sb, true
		}
	}
	return api.Sandbox{}, false
}

// ResolveTemplate implements HiddenCore.
func (m *Manager) ResolveTemplate(ctx context.Context, name string) (templates.Template, error) {
	return m.template(ctx, name)
}

// CreateHidden implements HiddenCore.
func (m *Manager) CreateHidden(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template, holder string, setup func(context.Context, *Handle) error) (*Handle, error) {
	if holder == "" {
		return nil, fmt.Errorf("creating a hidden sandbox without a holder: %w", errdefs.ErrInvalidArgument)
	}
	sb, err := m.createFrom(ctx, req, tmpl, holder)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	b := m.sandboxes[sb.ID]
	m.mu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("hidden sandbox %s vanished: %w", sb.ID, errdefs.ErrNotFound)
	}
	h := m.handle(b)
	if setup != nil {
		if err := setup(ctx, h); err != nil {
			m.discardHidden(ctx, b, "set-up failed")
			return nil, err
		}
	}
	b.life.Lock()
	err = m.pauseLocked(ctx, b, api.CausePool, "")
	b.life.Unlock()
	if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) { // a backend that cannot freeze keeps it running
		m.discardHidden(ctx, b, "pause failed")
		return nil, err
	}
	return h, nil
}

// discardHidden deletes hidden sandbox b that CreateHidden could not
// finish.
func (m *Manager) discardHidden(ctx context.Context, b *box, why string) {
	b.life.Lock()
	defer b.life.Unlock()
	if err := m.deleteLocked(ctx, b, api.CausePool); err != nil && !errdefs.IsNotFound(err) {
		m.log.ErrorContext(ctx, "deleting hidden sandbox", "sandbox", b.id(), "why", why, "err", err)
	}
}

// DeleteHidden implements HiddenCore.
func (m *Manager) DeleteHidden(ctx context.Context, h *Handle) error {
	b := h.b
	b.life.Lock()
	defer b.life.Unlock()
	if !b.isHidden() {
		return fmt.Errorf("sandbox %s is not hidden: %w", b.id(), errdefs.ErrNotFound)
	}
	return m.deleteLocked(ctx, b, api.CausePool)
}

// HandOut implements HiddenCore.
func (m *Manager) HandOut(ctx context.Context, h *Handle, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, error) {
	b := h.b
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if _, err := m.resolveRuntime(&req); err != nil {
		return api.Sandbox{}, err
	}
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	state, deleted, hidden, rt, id, tid := b.rec.Sandbox.State, b.deleted, b.hidden, b.rt, b.rec.Sandbox.ID, b.rec.Sandbox.TemplateID
	backend := m.backendName(b.rec)
	b.mu.Unlock()
	switch {
	case deleted || hidden == "":
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	case tid != tmpl.ID:
		return api.Sandbox{}, fmt.Errorf("made from template %s, now %s: %w", tid, tmpl.ID, errdefs.ErrConflict)
	case backend != req.Runtime:
		// A create that asks for one backend's isolation never gets a
		// sandbox of another, whatever an interceptor holds.
		return api.Sandbox{}, fmt.Errorf("sandbox %s runs on %s, the create asks for %s: %w", id, backend, req.Runtime, errdefs.ErrConflict)
	case state == api.StatePaused:
		p, ok := rt.(runtime.Pauser)
		if !ok {
			return api.Sandbox{}, fmt.Errorf("backend cannot thaw: %w", errdefs.ErrFailedPrecondition)
		}
		if err := p.Resume(ctx); err != nil {
			return api.Sandbox{}, err
		}
	case state != api.StateRunning:
		return api.Sandbox{}, fmt.Errorf("hidden sandbox is %s: %w", state, errdefs.ErrConflict)
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
	setHidden(&b.rec, "")
	b.hidden = ""
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
	m.observeBoxSince(ctx, OpCreate, b, req.Template, start, nil)
	m.log.InfoContext(ctx, "sandbox created from warm pool", "sandbox", id, "template", req.Template,
		"thawed", thawed, "took", time.Since(start))
	return b.view(), nil
}

// reapHidden deletes the hidden sandboxes an earlier daemon left (their
// holder makes new ones).
func (m *Manager) reapHidden(ctx context.Context) {
	m.mu.Lock()
	var stale []*box
	for _, b := range m.sandboxes {
		b.mu.Lock()
		if hiddenOf(b.rec) != "" {
			stale = append(stale, b)
		}
		b.mu.Unlock()
	}
	m.mu.Unlock()
	for _, b := range stale {
		b.life.Lock()
		if err := m.deleteLocked(ctx, b, api.CauseRecover); err != nil && !errdefs.IsNotFound(err) {
			m.log.ErrorContext(ctx, "deleting hidden sandbox of an earlier daemon", "sandbox", b.id(), "err", err)
		}
		b.life.Unlock()
	}
}
