package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Extension points.
//
// The core (this package) owns the registry of sandboxes, the per-sandbox
// operation lock, acquire/release (wake on use), starting and stopping
// guests, records and state transitions. A feature that needs to act on
// the life of a sandbox does not get a call from the core: it is an
// Extension, handed to New in Config.Extensions by the daemon (the
// composition root), that implements any of the small hook interfaces
// below. The core never imports a feature package; features import the
// core.
//
// Scenarios:
//
//  1. Creating a sandbox: PrepareHook.PrepareCreate sees the request
//     first. The guest starts and the sandbox is registered;
//     then StartHook.OnStart (cause api.CauseCreate) and CreateHook.OnCreate
//     run, in registration order. An error from either deletes the sandbox
//     again and fails the create with that error.
//  2. Running a command: ExecWrapper.WrapExec runs for every exec and
//     background process, under the sandbox's operation lock, in
//     registration order, and may change the request (environment, the
//     private flag). When the process has started, ExecRun.Started runs in
//     reverse registration order and may wrap the event stream, so the
//     first-registered wrapper's stream is the outermost one. Attaching to
//     a process (and watching it) passes its stream through
//     StreamWrapper.WrapStream the same way.
//  3. Sleeping and waking: StopHook.OnStop runs when the guest is paused,
//     hibernated or exits on its own; StartHook.OnStart runs whenever a new
//     guest of an existing sandbox answers (wake from hibernation, restore,
//     upgrade) and, at daemon start, RecoverHook.OnRecover for every
//     sandbox re-adopted.
//  4. Closing: Manager.Close closes every extension that is an io.Closer,
//     last registered first, before it forgets its sandboxes.
//  5. Deleting: DeleteHook.OnDelete runs once the sandbox is gone, on a
//     context without cancellation.
//  6. Observing: every Observer sees every operation (Op) as it completes
//     and every state transition as it happens, in order.
//
// Hooks of one sandbox never run concurrently with a delete of it: they
// run under its operation lock (shared for exec, exclusive for lifecycle
// changes). Hooks of different sandboxes run concurrently. A hook must not
// call a Manager method that takes the same sandbox's lock exclusively
// (delete, pause, hibernate, restore), or it deadlocks.

// Extension is a feature attached to the core. It implements any of the
// hook interfaces of this file (PrepareHook, CreateHook, StartHook, StopHook,
// DeleteHook, RecoverHook, PurgeHook, ExecWrapper, StreamWrapper, Observer,
// Provisioner); New checks each with a type assertion, once.
type Extension interface {
	// Name names the extension in logs (a hook's logged error says which
	// extension it came from).
	Name() string
}

// Provisioner is an Extension that needs the core beyond the Handle its
// hooks get, for instance to look a sandbox up when a request arrives
// from elsewhere (the API bridge). New calls Provision once, in
// registration order, before it returns: nothing can reach the extension's
// hooks before that. An error fails New.
type Provisioner interface {
	Provision(c Core) error
}

// Core is what the core offers extensions outside a hook call.
// *Manager implements it.
type Core interface {
	// Handle returns sandbox id as the caller of ctx sees it (ErrNotFound
	// for another tenant's, a pooled or an unknown sandbox).
	Handle(ctx context.Context, id string) (*Handle, error)
	// Acquire returns sandbox id running (woken first when asleep) with
	// its operation lock held shared; it counts as a call (the sandbox is
	// not idle until release). The caller must call release.
	Acquire(ctx context.Context, id string) (h *Handle, release func(), err error)
	// ListProcesses lists the processes started through exec; it counts as
	// a call (wakes a sleeping sandbox, resets its idle timer).
	ListProcesses(ctx context.Context, id string) ([]api.Process, error)
}

// PrepareHook sees every create request (not a warm pool's hand-out of a
// sandbox already prepared) after it is validated, before anything is
// allocated for it.
type PrepareHook interface {
	// PrepareCreate may normalize req (the network spec). An error fails
	// the create with it.
	PrepareCreate(ctx context.Context, req *api.CreateSandboxRequest) error
}

// CreateHook runs after a new sandbox's guest started (after OnStart).
type CreateHook interface {
	// OnCreate prepares a new sandbox. An error rolls the create back: the
	// sandbox is deleted (OnDelete runs) and the create fails with it.
	OnCreate(ctx context.Context, h *Handle) error
}

// StartHook runs whenever a guest of a sandbox has started and answers:
// at create (cause api.CauseCreate), when waking from hibernation (the
// wake's cause: api.CauseWake, api.CauseAPI), restoring (StartRestore) or
// upgrading (StartUpgrade). It does not run for a sandbox recovered at
// daemon start (see RecoverHook).
type StartHook interface {
	// OnStart is called with the sandbox's lock held exclusively (create:
	// before the sandbox is handed out). At create an error rolls the
	// create back; otherwise it is logged and the sandbox stays up.
	OnStart(ctx context.Context, h *Handle, cause string) error
}

// Causes of StartHook.OnStart besides the api.Cause* values.
const (
	StartRestore = "restore" // the sandbox was restored to a checkpoint
	StartUpgrade = "upgrade" // the sandbox's guest was upgraded
)

// StopHook runs when a sandbox's guest stops running: paused,
// hibernated, or exited on its own (to is the new state).
type StopHook interface {
	// OnStop's error is logged; the stop has happened.
	OnStop(ctx context.Context, h *Handle, to string)
}

// RecoverHook runs at daemon start for every sandbox re-adopted (running,
// paused, or hibernated; Handle.Runtime is nil for the latter), after it
// is registered.
type RecoverHook interface {
	// OnRecover's error is logged; the sandbox is adopted anyway.
	OnRecover(ctx context.Context, h *Handle) error
}

// DeleteHook runs after a sandbox is deleted: its guest, files and record
// are gone. It also runs for a sandbox whose create was rolled back.
type DeleteHook interface {
	// OnDelete runs on a context without cancellation; it has nothing to
	// return (the delete has happened), and should forget what it keeps
	// about the sandbox.
	OnDelete(ctx context.Context, id string)
}

// PurgeHook is an extension that keeps things a tenant owns (secrets).
type PurgeHook interface {
	// OnPurgeTenant deletes what tenant owns, on behalf of ctx (which acts
	// as the tenant), when the tenant is purged (Manager.PurgeTenant). Its
	// error is reported by PurgeTenant, which may be called again.
	OnPurgeTenant(ctx context.Context, tenant string) error
}

// ExecWrapper joins every exec and background process of every sandbox
// (secrets, run tokens and output redaction hook in here).
type ExecWrapper interface {
	// WrapExec runs after the request is validated, before the sandbox's
	// environment is merged under req.Env and the request goes to the
	// guest: what it puts into req.Env overrides the sandbox's
	// environment. It may change req. It returns nil when it has nothing to follow. On
	// error no process starts: the runs of wrappers before it are
	// aborted and the call fails with the error.
	WrapExec(ctx context.Context, h *Handle, req *api.ExecRequest) (ExecRun, error)
}

// ExecRun follows one process an ExecWrapper joined. Exactly one of its
// methods is called, once.
type ExecRun interface {
	// Started: process pid (in the sandbox's pid namespace) started. For
	// a foreground exec s is its event stream and the returned stream
	// replaces it; for a background process s is nil and the result is
	// ignored.
	Started(pid int, s ExecStream) ExecStream
	// Abort: the process did not start.
	Abort()
}

// StreamWrapper wraps the output of attaching to (or watching) a process
// that is already running.
type StreamWrapper interface {
	WrapStream(h *Handle, pid int, s ExecStream) ExecStream
}

// Observer sees every operation of the core (see Op). Observe is called
// synchronously, in the order operations happen, sometimes with the
// sandbox's internal lock held (transitions): it must return quickly and
// must not call the Manager. It cannot fail or change the operation.
type Observer interface {
	Observe(ctx context.Context, op Op)
}

// Kinds of operation an Observer sees.
const (
	OpCreate       = "create"
	OpDelete       = "delete"
	OpExec         = "exec"
	OpStartProcess = "start_process"
	OpAttach       = "attach"
	OpGuestCall    = "guest_call" // files, stdin, signals, resize, process list
	OpTransition   = "transition" // a state change; Op.Transition says which
	OpEvent        = "event"      // an event the core reports (OOM kill); Op.Event

	OpCheckpoint       = "checkpoint"        // Detail: the checkpoint's name
	OpDeleteCheckpoint = "delete_checkpoint" // Detail: the checkpoint id
	OpRestore          = "restore"           // Detail: the checkpoint reference
	OpFork             = "fork"              // Detail: the checkpoint id (fork of a checkpoint)
	OpMerge            = "merge"
	OpSaveTemplate     = "save_template" // Detail: the template's name
	OpUpgrade          = "upgrade"
)

// Op is one operation as an Observer sees it.
type Op struct {
	Kind    string
	Sandbox string
	// Tenant is the sandbox's owner.
	Tenant string
	// Detail says more about the operation (the guest call, the exec's
	// command), never a secret: exec environments are left out.
	Detail     string
	Transition *api.Transition
	Event      *api.SandboxEvent
	// Err is how the operation failed; nil when it succeeded.
	Err error
	At  time.Time
}

// Handle is an extension's view of one sandbox. It stays valid after the
// hook returns; its accessors read the sandbox's current state.
type Handle struct {
	b *box
	m *Manager
}

// ID is the sandbox's id.
func (h *Handle) ID() string { return h.b.id() }

// Sandbox returns the sandbox as recorded (a copy).
func (h *Handle) Sandbox() api.Sandbox { return h.b.view() }

// Owner is the tenant the sandbox belongs to.
func (h *Handle) Owner() string { return h.b.owner() }

// Guest returns the client of the sandbox's current guest (nil while it
// is hibernated).
func (h *Handle) Guest() *client.Client {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if h.b.rt == nil {
		return nil
	}
	return h.b.guest
}

// Runtime returns the sandbox's current backend instance: a different
// value after every guest start (nil while hibernated).
func (h *Handle) Runtime() runtime.Sandbox {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return h.b.rt
}

// Live reports whether the sandbox is running and not being deleted.
func (h *Handle) Live() bool {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return !h.b.deleted && h.b.rec.Sandbox.State == api.StateRunning
}

// StateDir is the sandbox's host-side state directory (root only, never
// visible inside the sandbox); it lives as long as the sandbox.
func (h *Handle) StateDir() string {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return h.b.rec.StateDir
}

// Update changes the sandbox's record with fn and persists it. The caller
// holds the sandbox's operation lock (inside a hook, or between
// Core.Acquire and its release); fn must not block.
func (h *Handle) Update(ctx context.Context, fn func(sb *api.Sandbox)) error {
	h.b.mu.Lock()
	fn(&h.b.rec.Sandbox)
	h.b.rec.UpdatedAt = time.Now().UTC()
	rec := h.b.rec
	h.b.mu.Unlock()
	if err := h.m.store.PutSandbox(ctx, rec); err != nil {
		return fmt.Errorf("saving record of sandbox %s: %w", rec.Sandbox.ID, err)
	}
	return nil
}

func (b *box) id() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rec.Sandbox.ID
}

// Handle implements Core.
func (m *Manager) Handle(ctx context.Context, id string) (*Handle, error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	return m.handle(b), nil
}

// Acquire implements Core.
func (m *Manager) Acquire(ctx context.Context, id string) (*Handle, func(), error) {
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return m.handle(b), release, nil
}

func (m *Manager) handle(b *box) *Handle { return &Handle{b: b, m: m} }

var _ Core = (*Manager)(nil)

// hooks are the extensions' hooks, by kind, in registration order. They
// are set by New and never change.
type hooks struct {
	prepare   []namedHook[PrepareHook]
	create    []namedHook[CreateHook]
	start     []namedHook[StartHook]
	stop      []namedHook[StopHook]
	recover   []namedHook[RecoverHook]
	delete    []namedHook[DeleteHook]
	purge     []namedHook[PurgeHook]
	exec      []namedHook[ExecWrapper]
	stream    []namedHook[StreamWrapper]
	observers []Observer
}

type namedHook[T any] struct {
	name string
	h    T
}

// collectHooks sorts exts into hooks.
func collectHooks(exts []Extension) (hooks, error) {
	var hs hooks
	seen := map[string]bool{}
	for _, e := range exts {
		if e == nil {
			return hooks{}, errors.New("sandbox manager: nil extension")
		}
		n := e.Name()
		if seen[n] {
			return hooks{}, fmt.Errorf("sandbox manager: extension %s registered twice", n)
		}
		seen[n] = true
		if h, ok := e.(PrepareHook); ok {
			hs.prepare = append(hs.prepare, namedHook[PrepareHook]{n, h})
		}
		if h, ok := e.(CreateHook); ok {
			hs.create = append(hs.create, namedHook[CreateHook]{n, h})
		}
		if h, ok := e.(StartHook); ok {
			hs.start = append(hs.start, namedHook[StartHook]{n, h})
		}
		if h, ok := e.(StopHook); ok {
			hs.stop = append(hs.stop, namedHook[StopHook]{n, h})
		}
		if h, ok := e.(RecoverHook); ok {
			hs.recover = append(hs.recover, namedHook[RecoverHook]{n, h})
		}
		if h, ok := e.(DeleteHook); ok {
			hs.delete = append(hs.delete, namedHook[DeleteHook]{n, h})
		}
		if h, ok := e.(PurgeHook); ok {
			hs.purge = append(hs.purge, namedHook[PurgeHook]{n, h})
		}
		if h, ok := e.(ExecWrapper); ok {
			hs.exec = append(hs.exec, namedHook[ExecWrapper]{n, h})
		}
		if h, ok := e.(StreamWrapper); ok {
			hs.stream = append(hs.stream, namedHook[StreamWrapper]{n, h})
		}
		if h, ok := e.(Observer); ok {
			hs.observers = append(hs.observers, h)
		}
	}
	return hs, nil
}

// provision calls every Provisioner of exts.
func (m *Manager) provision(exts []Extension) error {
	for _, e := range exts {
		if p, ok := e.(Provisioner); ok {
			if err := p.Provision(m); err != nil {
				return fmt.Errorf("sandbox manager: extension %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// prepare runs the prepare hooks on a create request.
func (m *Manager) prepare(ctx context.Context, req *api.CreateSandboxRequest) error {
	for _, x := range m.hooks.prepare {
		if err := x.h.PrepareCreate(ctx, req); err != nil {
			return err
		}
	}
	return nil
}

// closeExtensions closes the extensions that are io.Closers, last first.
func (m *Manager) closeExtensions() {
	for i := len(m.cfg.Extensions) - 1; i >= 0; i-- {
		if c, ok := m.cfg.Extensions[i].(io.Closer); ok {
			if err := c.Close(); err != nil {
				m.log.Warn("closing extension", "extension", m.cfg.Extensions[i].Name(), "err", err)
			}
		}
	}
}

// onCreate runs the start hooks (cause create) and then the create hooks
// of a new sandbox; the first error stops them.
func (m *Manager) onCreate(ctx context.Context, b *box) error {
	h := m.handle(b)
	for _, x := range m.hooks.start {
		if err := x.h.OnStart(ctx, h, api.CauseCreate); err != nil {
			return err
		}
	}
	for _, x := range m.hooks.create {
		if err := x.h.OnCreate(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// onStart runs the start hooks of a sandbox whose new guest answers;
// errors are logged.
func (m *Manager) onStart(ctx context.Context, b *box, cause string) {
	h := m.handle(b)
	for _, x := range m.hooks.start {
		if err := x.h.OnStart(ctx, h, cause); err != nil {
			m.log.WarnContext(ctx, "start hook failed", "extension", x.name, "sandbox", h.ID(), "cause", cause, "err", err)
		}
	}
}

// onStop runs the stop hooks of a sandbox whose guest stopped.
func (m *Manager) onStop(ctx context.Context, b *box, to string) {
	h := m.handle(b)
	for _, x := range m.hooks.stop {
		x.h.OnStop(ctx, h, to)
	}
}

// onRecover runs the recover hooks of a re-adopted sandbox; errors are
// logged.
func (m *Manager) onRecover(ctx context.Context, b *box) {
	h := m.handle(b)
	for _, x := range m.hooks.recover {
		if err := x.h.OnRecover(ctx, h); err != nil {
			m.log.WarnContext(ctx, "recover hook failed", "extension", x.name, "sandbox", h.ID(), "err", err)
		}
	}
}

// onDelete runs the delete hooks of a deleted sandbox.
func (m *Manager) onDelete(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx)
	for _, x := range m.hooks.delete {
		x.h.OnDelete(ctx, id)
	}
}

// execChain is the ExecRuns of one process, in registration order.
type execChain []ExecRun

// wrapExec runs the exec wrappers on req. On error the runs joined so far
// are aborted.
func (m *Manager) wrapExec(ctx context.Context, b *box, req *api.ExecRequest) (execChain, error) {
	h := m.handle(b)
	var chain execChain
	for _, x := range m.hooks.exec {
		r, err := x.h.WrapExec(ctx, h, req)
		if err != nil {
			chain.abort()
			return nil, err
		}
		if r != nil {
			chain = append(chain, r)
		}
	}
	return chain, nil
}

// abort tells every run that its process did not start.
func (c execChain) abort() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i].Abort()
	}
}

// started tells every run, last first, that process pid started, threading
// s (nil for a background process) through them.
func (c execChain) started(pid int, s ExecStream) ExecStream {
	for i := len(c) - 1; i >= 0; i-- {
		if w := c[i].Started(pid, s); s != nil && w != nil {
			s = w
		}
	}
	return s
}

// wrapStream passes the stream of an attach or watch of process pid
// through the stream wrappers, last first.
func (m *Manager) wrapStream(b *box, pid int, s ExecStream) ExecStream {
	h := m.handle(b)
	for i := len(m.hooks.stream) - 1; i >= 0; i-- {
		if w := m.hooks.stream[i].h.WrapStream(h, pid, s); w != nil {
			s = w
		}
	}
	return s
}

// observe shows op to every observer.
func (m *Manager) observe(ctx context.Context, op Op) {
	if len(m.hooks.observers) == 0 {
		return
	}
	if op.At.IsZero() {
		op.At = m.cfg.Clock.Now().UTC()
	}
	for _, o := range m.hooks.observers {
		o.Observe(ctx, op)
	}
}

// observeBox shows an operation on b that ended with err.
func (m *Manager) observeBox(ctx context.Context, kind string, b *box, detail string, err error) {
	if len(m.hooks.observers) == 0 {
		return
	}
	m.observe(ctx, Op{Kind: kind, Sandbox: b.id(), Tenant: b.owner(), Detail: detail, Err: err})
}

// observeID shows an operation on sandbox id ("" for none, e.g. a
// checkpoint's) that ended with err.
func (m *Manager) observeID(ctx context.Context, kind, id, detail string, err error) {
	if len(m.hooks.observers) == 0 {
		return
	}
	op := Op{Kind: kind, Sandbox: id, Detail: detail, Err: err}
	if id != "" {
		m.mu.Lock()
		b := m.sandboxes[id]
		m.mu.Unlock()
		if b != nil {
			op.Tenant = b.owner()
		}
	}
	m.observe(ctx, op)
}

// observeTransition shows b's last transition (one recorded without
// setStateLocked: a create, a warm pool's hand-out).
func (m *Manager) observeTransition(ctx context.Context, b *box) {
	if len(m.hooks.observers) == 0 {
		return
	}
	b.mu.Lock()
	var t *api.Transition
	if lt := b.rec.Sandbox.LastTransition; lt != nil {
		c := *lt
		t = &c
	}
	b.mu.Unlock()
	if t != nil {
		m.observe(ctx, Op{Kind: OpTransition, Sandbox: b.id(), Tenant: b.owner(), Transition: t, At: t.At})
	}
}
