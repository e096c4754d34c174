package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// What the core offers features that read sandboxes' files on the host
// (internal/snapshot: diff, tree hash, merge). Every directory returned is
// a host path below the data dir, for root to read with lstat and
// O_NOFOLLOW (internal/layers), never to follow a link in.

// ReadFS returns the host directories of the sandbox's filesystem,
// top-most first (its writable upper directory, then its layers), with
// its operation lock held shared: no restore, checkpoint or delete
// changes them until release is called (its processes keep running, so a
// file being written shows in either state). It does not wake a sleeping
// sandbox and does not count as a call; a hibernated sandbox's disk is
// mounted for the read, with its lock held exclusively instead
// (LockFiles). The caller must call release, once. A deleted sandbox is
// ErrNotFound. It must not be called with the sandbox's lock held
// (inside a hook).
func (h *Handle) ReadFS(ctx context.Context) (dirs []string, release func(), err error) {
	b, id, m := h.b, h.ID(), h.m
	b.life.RLock()
	b.mu.Lock()
	deleted, upper, lowers, state := b.deleted, b.rec.UpperDir, slices.Clone(b.rec.Layers), b.rec.Sandbox.State
	b.mu.Unlock()
	if !deleted && state == api.StateHibernated {
		b.life.RUnlock()
		h, unlock, err := m.LockFiles(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		upper, lowers := h.Dirs()
		return append([]string{upper}, lowers...), unlock, nil
	}
	if deleted {
		b.life.RUnlock()
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return append([]string{upper}, lowers...), b.life.RUnlock, nil
}

// ForkBase is the id of the checkpoint the sandbox was forked from ("" for
// a sandbox that is no fork): the common ancestor of a merge with its
// parent or a sibling.
func (h *Handle) ForkBase() string {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return extraOf(h.b.rec).ForkBase
}

// Report shows op, an operation a feature carried out (a merge), to
// every Observer, as the core's own operations are; an empty op.Tenant is
// filled in from op.Sandbox. It follows Observer's rules: synchronous, in
// order, never failing.
func (m *Manager) Report(ctx context.Context, op Op) {
	if len(m.hooks.observers) == 0 {
		return
	}
	if op.Sandbox != "" && op.Tenant == "" {
		m.mu.Lock()
		b := m.sandboxes[op.Sandbox]
		m.mu.Unlock()
		if b != nil {
			op.Tenant = b.owner()
		}
	}
	m.observe(ctx, op)
}

// What the core offers the checkpoint feature (internal/snapshot:
// checkpoints, restore, fork, exec transactions). A checkpoint is a layer
// of the layer store; the feature keeps the records and the layers' own
// references, the core the sandboxes that run on them.

// LayerOwner names the reference sandbox id holds on the top layer it runs
// on when that layer is no template's (a checkpoint's: the sandbox was
// forked or restored). The feature takes it before CreateFork or
// Handle.Reset; the core drops it when the sandbox is deleted, and at
// start-up for every sandbox that no longer exists.
func LayerOwner(id string) string { return sandboxRef(id) }

// NewID returns a fresh sandbox id.
func NewID() string { return newID() }

// LockRunning wakes sandbox id when it sleeps, takes its operation lock
// exclusively and checks that it runs (ErrConflict otherwise; ErrNotFound
// when it is being deleted). Checkpoint, restore and fork hold it: they
// are serialised with each other, with delete, and with the set-up of exec
// and file calls. The caller calls unlock, once; meanwhile it may call
// the Handle's Dirs, Frozen and Reset, and no Manager method that takes
// the same sandbox's lock.
func (m *Manager) LockRunning(ctx context.Context, id string) (h *Handle, unlock func(), err error) {
	b, unlock, err := m.lockRunning(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return m.handle(b), unlock, nil
}

// LockFiles takes sandbox id's operation lock exclusively without waking
// it: a running, paused or hibernated sandbox stays so (any other state is
// ErrConflict; a sandbox being deleted ErrNotFound). Its writable upper
// directory is on the host until unlock (a hibernated sandbox's disk is
// mounted meanwhile). Checkpoint and fork hold it, so they never wake a
// sleeping source. The caller calls unlock, once; meanwhile it may call
// the Handle's Dirs, Frozen and Note (not Reset: a restore needs a guest,
// LockRunning).
func (m *Manager) LockFiles(ctx context.Context, id string) (h *Handle, unlock func(), err error) {
	b, unlock, err := m.lockLive(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	state, rec := b.rec.Sandbox.State, b.rec
	b.mu.Unlock()
	switch state {
	case api.StateRunning, api.StatePaused:
	case api.StateHibernated:
		if err := m.mountDisk(rec); err != nil {
			unlock()
			return nil, nil, err
		}
		locked := unlock
		unlock = func() {
			if err := m.unmountDisk(id); err != nil {
				m.log.WarnContext(ctx, "unmounting the disk of a hibernated sandbox", "sandbox", id, "err", err)
			}
			locked()
		}
	default:
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s is %s: %w", id, state, errdefs.ErrConflict)
	}
	return m.handle(b), unlock, nil
}

// Note records an operation that kept the sandbox in its state (cause
// api.CauseCheckpoint, CauseRestore, ...) in its transition log, shows it
// to observers as a transition and persists the record. The caller holds
// the sandbox's lock (LockRunning, LockFiles).
func (h *Handle) Note(ctx context.Context, cause, detail string) error {
	return h.m.note(ctx, h.b, cause, detail)
}

// note does Handle.Note with b.life held.
func (m *Manager) note(ctx context.Context, b *box, cause, detail string) error {
	b.mu.Lock()
	m.setStateLocked(b, b.rec.Sandbox.State, cause, detail)
	b.mu.Unlock()
	return m.saveLocked(ctx, b)
}

// Dirs returns the sandbox's writable upper directory and the host
// directories of the layers it runs on, top-most first. They change only
// with Reset (and a delete): the caller holds the sandbox's lock.
func (h *Handle) Dirs() (upper string, lowers []string) {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return h.b.rec.UpperDir, slices.Clone(h.b.rec.Layers)
}

// Frozen runs fn with the sandbox's processes frozen, when its backend can
// freeze them (runtime.Pauser; otherwise they keep running), and thaws
// them on every path; a failure to thaw is joined to fn's error. A paused
// sandbox stays frozen and a hibernated one has no process: fn runs as it
// is. The caller holds the sandbox's lock (LockRunning, LockFiles).
func (h *Handle) Frozen(ctx context.Context, fn func() error) (err error) {
	h.b.mu.Lock()
	state := h.b.rec.Sandbox.State
	h.b.mu.Unlock()
	if state != api.StateRunning {
		return fn()
	}
	if p, ok := h.Runtime().(runtime.Pauser); ok {
		if err := p.Pause(ctx); err != nil {
			return err
		}
		defer func() {
			if rerr := p.Resume(context.WithoutCancel(ctx)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("thawing: %w", rerr))
			}
		}()
	}
	return fn()
}

// Reset puts the sandbox on new layers: its guest and every process are
// stopped, its layers become lowers (top-most first) with an empty
// writable upper directory on top, and the guest is started again under
// the same id, hostname and socket; StartHook.OnStart runs with cause
// StartRestore and the record is saved. The caller holds the sandbox's
// lock (LockRunning) and the sandbox's reference on lowers' top layer
// (LayerOwner). When the guest cannot be started again the sandbox is
// left stopped (only delete works) and the error returned. It runs to its
// end even when ctx is cancelled.
func (h *Handle) Reset(ctx context.Context, lowers []string) error {
	return h.ResetMemory(ctx, lowers, "")
}

// ResetMemory is Reset, with the sandbox's processes continuing from the
// memory image in dir (written by CheckpointMemory over the files of
// lowers) instead of a new guest starting, when dir is not "": its
// backend must be a runtime.MemoryRestorer (else the sandbox is left
// stopped with ErrFailedPrecondition; callers check first).
func (h *Handle) ResetMemory(ctx context.Context, lowers []string, dir string) error {
	m, b := h.m, h.b
	ctx = context.WithoutCancel(ctx)
	id := b.id()
	var old runtime.Sandbox
	fail := func(err error) error {
		b.mu.Lock()
		b.rt = old
		m.setStateLocked(b, api.StateStopped, api.CauseError, "restore failed")
		r := b.rec
		b.mu.Unlock()
		r.UpdatedAt = time.Now().UTC()
		if perr := m.store.PutSandbox(ctx, r); perr != nil {
			m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", id, "err", perr)
		}
		return err
	}
	old, err := m.stopGuestLocked(ctx, b)
	if err != nil {
		return fail(err)
	}
	trash, err := m.freshUpper(id)
	if err != nil {
		return fail(err)
	}
	go func() { _ = os.RemoveAll(trash) }()
	if err := m.startGuestFromLocked(ctx, b, lowers, dir); err != nil {
		return fail(err)
	}
	m.onStart(ctx, b, StartRestore)
	return m.saveLocked(ctx, b)
}

// CheckpointMemory writes the sandbox's memory and process image into dir
// (runtime.MemoryCheckpointer), running frozen while its processes are
// stopped (the caller copies its files there, so both match), and leaves
// it running. A backend without memory checkpoints is
// ErrFailedPrecondition, a sandbox that is not running ErrConflict. The
// caller holds the sandbox's lock (LockRunning).
func (h *Handle) CheckpointMemory(ctx context.Context, dir string, frozen func() error) error {
	h.b.mu.Lock()
	state, rt := h.b.rec.Sandbox.State, h.b.rt
	h.b.mu.Unlock()
	if state != api.StateRunning || rt == nil {
		return fmt.Errorf("sandbox %s is %s: a memory checkpoint needs it running: %w", h.ID(), state, errdefs.ErrConflict)
	}
	mc, ok := rt.(runtime.MemoryCheckpointer)
	if !ok {
		return fmt.Errorf("sandbox %s runs on the %s backend, which has no memory checkpoints (gvisor has): %w", h.ID(), h.b.view().Backend, errdefs.ErrFailedPrecondition)
	}
	err := mc.CheckpointMemory(ctx, dir, frozen)
	// The backend's state may have changed (gvisor: the guest's secret).
	h.b.mu.Lock()
	h.b.rec.RuntimeState = rt.State()
	h.b.mu.Unlock()
	if serr := h.m.saveLocked(ctx, h.b); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// ForkSpec is a sandbox CreateFork makes on the layers of a checkpoint.
type ForkSpec struct {
	// ID is the new sandbox's id (NewID); the caller holds its reference
	// (LayerOwner) on Layers' top layer.
	ID string
	// Base is the checkpoint's id: the fork's merge base (Handle.ForkBase).
	Base string
	// Layers are the checkpoint's layer directories, top-most first.
	Layers []string
	// The new sandbox's owner, template, environment, labels and
	// resources (its disk cap included: its writable layer starts empty
	// under a quota of its own).
	Tenant, Template, TemplateID string
	Env, Labels                  map[string]string
	Resources                    api.Resources
	// Runtime is the backend the fork runs on, the checkpoint's source
	// sandbox's ("": the default); one this daemon does not run fails the
	// fork.
	Runtime string
	// MemoryImage, when not "", is a memory image of the checkpoint
	// (Handle.CheckpointMemory): the fork's processes continue from it
	// (runtime.MemoryRestorer) instead of a new guest starting. Kernel
	// state comes with the image, but for the hostname, which is the
	// fork's own (its id: the runtime.MemoryRestorer contract).
	MemoryImage string
}

// CreateFork creates and starts sandbox spec.ID with a fresh identity:
// its hostname is its id, and its writable layer gets its own
// /etc/machine-id and /var/lib/systemd/random-seed, never the source's.
// The create hooks run as for any create, and observers see an OpCreate.
// On error nothing of the sandbox is left but the caller's layer
// reference. Admission against the tenant's quotas is the caller's.
func (m *Manager) CreateFork(ctx context.Context, spec ForkSpec) (_ api.Sandbox, err error) {
	id := spec.ID
	p := m.paths(id)
	backend, err := m.backends.Lookup(spec.Runtime)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating fork %s: %w", id, err)
	}
	rec := store.SandboxRecord{
		Sandbox: api.Sandbox{
			ID:         id,
			Tenant:     tenant.Owner(spec.Tenant),
			Template:   spec.Template,
			TemplateID: spec.TemplateID,
			State:      api.StateCreating,
			Env:        spec.Env,
			Labels:     cloneMap(spec.Labels),
			Resources:  spec.Resources,
			Hostname:   id,
			Backend:    backend.Capabilities().Name,
			CreatedAt:  time.Now().UTC(),
		},
		Layers:     spec.Layers,
		UpperDir:   p.upper,
		WorkDir:    p.work,
		SocketPath: p.socket,
		StateDir:   p.state,
	}
	setExtra(&rec, recordExtra{ForkBase: spec.Base})
	remove, err := m.makeSandboxDir(ctx, rec)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating fork %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			remove()
		}
	}()
	if err := writeIdentity(p.upper, spec.Layers, int(m.cfg.IDs.HostID)); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating fork %s: writing identity: %w", id, err)
	}
	b, err := m.startFrom(ctx, rec, false, spec.MemoryImage)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.onCreate(ctx, b); err != nil {
		_ = m.DeleteSandbox(context.WithoutCancel(ctx), id)
		m.observeBox(ctx, OpCreate, b, "fork of "+spec.Base, err)
		return api.Sandbox{}, fmt.Errorf("creating fork %s: %w", id, err)
	}
	m.observeBox(ctx, OpCreate, b, "fork of "+spec.Base, nil)
	return b.view(), nil
}

// RescueHook is an Extension that can put back the files of a sandbox on
// which no guest starts any more (a runner upgrade whose every fallback
// failed): the checkpoint feature restores its latest checkpoint.
type RescueHook interface {
	// Rescue runs with h's lock held exclusively and no guest running; it
	// may call h.Reset. It reports what the sandbox was put back to (a
	// checkpoint id) and whether a guest runs again; false when it had
	// nothing to put back or failed (it logs why).
	Rescue(ctx context.Context, h *Handle) (to string, ok bool)
}

// rescue asks the RescueHooks, in registration order, to put b back.
func (m *Manager) rescue(ctx context.Context, b *box) (string, bool) {
	for _, e := range m.cfg.Extensions {
		if r, ok := e.(RescueHook); ok {
			if to, ok := r.Rescue(ctx, m.handle(b)); ok {
				return to, true
			}
		}
	}
	return "", false
}
