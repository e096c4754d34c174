package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// WrapExec implements sandbox.ExecWrapper: it follows every exec and
// background process to count it and, for a foreground exec, time it from
// now to its final event. It never changes req and never fails.
func (m *Metrics) WrapExec(_ context.Context, _ *sandbox.Handle, req *api.ExecRequest) (sandbox.ExecRun, error) {
	return &execRun{m: m, start: time.Now(), background: req.Background}, nil
}

// execRun follows one process (sandbox.ExecRun).
type execRun struct {
	m          *Metrics
	start      time.Time
	background bool
}

func (r *execRun) Abort() {
	r.m.execs.WithLabelValues(r.mode(), OutcomeNotStarted).Inc()
}

func (r *execRun) mode() string {
	if r.background {
		return "background"
	}
	return "foreground"
}

func (r *execRun) Started(_ int, s execstream.Stream) execstream.Stream {
	if s == nil || r.background {
		r.m.execs.WithLabelValues(r.mode(), OutcomeStarted).Inc()
		return nil
	}
	return &timedStream{Stream: s, run: r}
}

// done counts the exec once with outcome.
func (r *execRun) done(outcome string) {
	r.m.execs.WithLabelValues("foreground", outcome).Inc()
	r.m.execSeconds.WithLabelValues(outcome).Observe(time.Since(r.start).Seconds())
}

// timedStream passes a foreground exec's events through and counts the
// exec at its final event (or when it is closed before one).
type timedStream struct {
	execstream.Stream
	run  *execRun
	once sync.Once
}

func (t *timedStream) Next() (api.ExecEvent, error) {
	ev, err := t.Stream.Next()
	if err != nil {
		t.once.Do(func() { t.run.done(OutcomeAbandoned) })
		return ev, err
	}
	if execstream.Final(ev) {
		t.once.Do(func() { t.run.done(exitOutcome(ev)) })
	}
	return ev, nil
}

func (t *timedStream) Close() error {
	t.once.Do(func() { t.run.done(OutcomeAbandoned) })
	return t.Stream.Close()
}

// exitOutcome classifies a final event.
func exitOutcome(ev api.ExecEvent) string {
	switch {
	case ev.Type == api.EventError:
		return OutcomeError
	case ev.OOMKilled:
		return OutcomeOOM
	case ev.TimedOut:
		return OutcomeTimeout
	case ev.Signal != "":
		return OutcomeSignal
	case ev.ExitCode != nil && *ev.ExitCode == 0:
		return OutcomeOK
	default:
		return OutcomeNonzero
	}
}
