package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Handle is an extension's view of one sandbox. It stays valid after the
// hook returns; its accessors read the sandbox's current state.
type Handle struct {
	b *box
	m *Manager
}

// ID is the sandbox's id.
func (h *Handle) ID() string { return h.b.id() }

// Sandbox returns the sandbox as recorded (a copy), without the live
// limit reports of Manager.GetSandbox: it reads no cgroup counters and no
// filesystem, so it is what hot paths (the pipeline resolves the sandbox
// of every run) use.
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

// Busy counts an activity on the sandbox until the returned function is
// called (once; further calls do nothing): the idle policy does not pause,
// hibernate or delete it meanwhile, and its idle clock restarts when the
// function is called. It takes no lock and wakes nothing: a feature that
// keeps a connection into the sandbox open past a Core.Acquire (the
// service proxy's WebSockets and streamed responses) calls it before it
// releases, so the connection counts as activity without holding off a
// delete, as an open exec stream does.
func (h *Handle) Busy() func() { return h.m.busy(h.b) }

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
