package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Stats returns the resource counters of the sandbox's cgroup (CPU time
// since its guest started, current memory, OOM kills; Pids may be 0: see
// counters). It does not count as activity and never wakes the sandbox:
// one with no live guest (asleep, stopped) and a backend without counters
// are both ErrFailedPrecondition: "no sample now"; a deleted sandbox is
// ErrNotFound.
func (h *Handle) Stats(ctx context.Context) (runtime.Stats, error) {
	b, id := h.b, h.ID()
	b.mu.Lock()
	rt, deleted := b.rt, b.deleted
	b.mu.Unlock()
	if deleted {
		return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	st, err := counters(ctx, rt)
	if errors.Is(err, errNoCounters) {
		return runtime.Stats{}, fmt.Errorf("sandbox %s has no resource counters now: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading counters of sandbox %s: %w", id, err)
	}
	return st, nil
}

// errNoCounters: the runtime sandbox (nil without a live guest) reports
// no counters.
var errNoCounters = errors.New("no resource counters")

// counters samples rt's cgroup counters the cheap way: through
// runtime.CounterReader when rt has it (Pids is then 0; gvisor's full
// Stats runs a runsc subprocess, which the exec path, sampling around every
// exec, must not pay), else its Stats; errNoCounters when it has neither.
func counters(ctx context.Context, rt runtime.Sandbox) (runtime.Stats, error) {
	if cr, ok := rt.(runtime.CounterReader); ok {
		return cr.Counters(ctx)
	}
	if sr, ok := rt.(runtime.StatsReader); ok {
		return sr.Stats(ctx)
	}
	return runtime.Stats{}, errNoCounters
}

// Watch streams the rest of process pid's events (no replay) to an
// observer such as the run recorder of internal/pipeline. Unlike
// Manager.Attach it is not activity: it neither wakes the sandbox nor
// keeps it from going idle, and output passes through every
// StreamWrapper (redaction) like every stream. The stream ends with the
// exit event, or with an error when the guest goes away (the sandbox is
// hibernated, restarted or deleted); without a live guest it is
// ErrFailedPrecondition.
func (h *Handle) Watch(ctx context.Context, pid int) (execstream.Stream, error) {
	b, id, m := h.b, h.ID(), h.m
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

// NewRunID returns a fresh run id ("run_" and 24 hex digits).
func NewRunID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "run_" + hex.EncodeToString(b[:])
}

// RunIDFrom returns the run id ctx carries (WithRunID), or "".
func RunIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(runIDKey{}).(string)
	return id
}
