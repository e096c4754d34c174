package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Stopping and starting a sandbox's guest under the same identity: the one
// code path restore (checkpoint.go), hibernate and wake (lifecycle.go) use.
// Both run with b.life held exclusively.

// stopGuestLocked stops b's guest and every process of the sandbox (its
// cgroup, socket and backend state dir go too; the layers, upper and work
// dirs stay). Afterwards b.rt is nil, so the exit watcher of the old guest
// ignores its exit. It returns the old runtime (nil when none ran), which a
// caller that fails later may put back so that delete finds it.
func (m *Manager) stopGuestLocked(ctx context.Context, b *box) (runtime.Sandbox, error) {
	b.mu.Lock()
	old := b.rt
	b.rt = nil
	b.mu.Unlock()
	if old == nil {
		return nil, nil
	}
	if err := old.Destroy(context.WithoutCancel(ctx)); err != nil {
		return old, fmt.Errorf("stopping guest: %w", err)
	}
	return old, nil
}

// startGuestLocked starts a new guest for b on layers (top-most first) over
// b's existing upper and work dirs, with the same id, hostname and socket,
// waits until it answers, and makes it b's, with its exit watcher
// started; the caller runs the start hooks (onStart). The caller sets the state (a restore keeps
// running, a wake records its transition) and persists the record. On error nothing of the new guest is left and b is
// unchanged.
func (m *Manager) startGuestLocked(ctx context.Context, b *box, layers []string) error {
	return m.startGuestFromLocked(ctx, b, layers, "")
}

// startGuestFromLocked is startGuestLocked, with the sandbox's processes
// restored from the memory image in dir when it is not "" (the backend's
// runtime.MemoryRestorer; ErrFailedPrecondition when it has none).
func (m *Manager) startGuestFromLocked(ctx context.Context, b *box, layers []string, image string) error {
	ctx = context.WithoutCancel(ctx)
	b.mu.Lock()
	rec := b.rec
	b.mu.Unlock()
	rec.Layers = layers
	if err := m.mountDisk(rec); err != nil { // unmounted while hibernated
		return fmt.Errorf("starting guest: %w", err)
	}
	if err := os.MkdirAll(m.paths(rec.Sandbox.ID).state, 0o700); err != nil {
		return fmt.Errorf("starting guest: %w", err)
	}
	be, err := m.backendOf(rec)
	if err != nil {
		return fmt.Errorf("starting guest: %w", err)
	}
	rt, err := createOrRestore(ctx, be, m.runtimeSpec(rec), image)
	if err != nil {
		return fmt.Errorf("starting guest: %w", err)
	}
	guest := client.New(rt.SocketPath())
	vctx, cancel := context.WithTimeout(ctx, guestReadyWait)
	version, err := guest.Version(vctx)
	cancel()
	if err != nil {
		_ = rt.Destroy(ctx)
		return fmt.Errorf("waiting for guest: %w", err)
	}
	b.mu.Lock()
	b.rt, b.guest = rt, guest
	b.rec.Layers = layers
	b.rec.RuntimeState = rt.State()
	b.rec.Sandbox.GuestVersion = version
	b.mu.Unlock()
	go m.watch(b, rt)
	return nil
}

// saveLocked persists b's record.
func (m *Manager) saveLocked(ctx context.Context, b *box) error {
	b.mu.Lock()
	b.rec.UpdatedAt = time.Now().UTC()
	rec := b.rec
	b.mu.Unlock()
	if err := m.store.PutSandbox(context.WithoutCancel(ctx), rec); err != nil {
		return fmt.Errorf("saving record of sandbox %s: %w", rec.Sandbox.ID, err)
	}
	return nil
}

// createOrRestore starts spec's sandbox on be: Create, or RestoreMemory
// from image when image is not "".
func createOrRestore(ctx context.Context, be runtime.Backend, spec runtime.Spec, image string) (runtime.Sandbox, error) {
	if image == "" {
		return be.Create(ctx, spec)
	}
	mr, ok := be.(runtime.MemoryRestorer)
	if !ok {
		return nil, fmt.Errorf("the %s backend has no memory checkpoints: %w", be.Capabilities().Name, errdefs.ErrFailedPrecondition)
	}
	return mr.RestoreMemory(ctx, spec, image)
}
