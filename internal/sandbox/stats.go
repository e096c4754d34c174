package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/runtime"
)

// SandboxStats returns the resource counters of a sandbox's cgroup (CPU
// time since its guest started, current memory). It does not count as
// activity and never wakes the sandbox: one with no live guest (asleep,
// stopped) and a backend without counters are both ErrFailedPrecondition:
// "no sample now".
func (m *Manager) SandboxStats(ctx context.Context, id string) (runtime.Stats, error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	b.mu.Lock()
	rt, deleted := b.rt, b.deleted
	b.mu.Unlock()
	if deleted {
		return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sr, ok := rt.(runtime.StatsReader)
	if !ok {
		return runtime.Stats{}, fmt.Errorf("sandbox %s has no resource counters now: %w", id, errdefs.ErrFailedPrecondition)
	}
	st, err := sr.Stats(ctx)
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading counters of sandbox %s: %w", id, err)
	}
	return st, nil
}

// WatchProcess streams the rest of process pid's events (no replay) to an
// observer such as the run recorder of internal/pipeline. Unlike Attach it
// is not activity: it neither wakes the sandbox nor keeps it from going
// idle, and output is redacted like every stream. The stream ends with the
// exit event, or with an error when the guest goes away (the sandbox is
// hibernated, restarted or deleted).
func (m *Manager) WatchProcess(ctx context.Context, id string, pid int) (execstream.Stream, error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	g, deleted := b.guest, b.deleted
	b.mu.Unlock()
	if deleted || g == nil {
		return nil, fmt.Errorf("watching process %d: sandbox %s has no live guest: %w", pid, id, errdefs.ErrFailedPrecondition)
	}
	s, err := g.Attach(ctx, pid, false)
	if err != nil {
		return nil, fmt.Errorf("watching process %d in sandbox %s: %w", pid, id, err)
	}
	return m.wrapStream(b, pid, s), nil
}

type runIDKey struct{}

// WithRunID returns ctx naming id as the run an exec started with ctx
// belongs to (internal/pipeline's run record). The exec's run token, if it
// gets one, then carries that id, so egress records and bridge events name
// the same run as the run record.
func WithRunID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, runIDKey{}, id)
}

// RunIDFrom returns the run id ctx carries (WithRunID), or "".
func RunIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(runIDKey{}).(string)
	return id
}
