// Package sandboxevents records the events programs inside a sandbox send
// through the API bridge (log, metric and usage records) and the events
// the sandbox core reports (OOM kills): one log line each and a bounded
// per-sandbox buffer queryable through the API. Secret values the
// sandbox's runs were given are redacted from bridge events first, like
// from exec output.
//
// It is a feature attached to the sandbox core: an Observer of the core's
// OpEvent operations and a DeleteHook that forgets a deleted sandbox's
// buffer.
package sandboxevents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// maxSandboxEvents is the size of each sandbox's event buffer; the oldest
// events are dropped first.
const maxSandboxEvents = 1000

// Config configures a Recorder.
type Config struct {
	// Redactor returns the redactor of sandbox id's output (nil: nothing
	// to redact); nil redacts nothing.
	Redactor func(id string) *redact.Redactor
	// OnRecord, when set, is called with every bridge event recorded,
	// redacted (the flight recorder keeps them: internal/audit).
	OnRecord func(ev api.SandboxEvent)
	Logger   *slog.Logger
}

// Recorder is the extension: register it in sandbox.Config.Extensions.
// Its methods are safe for concurrent use.
type Recorder struct {
	cfg  Config
	core sandbox.Core // set by Provision, before any hook runs

	// mu guards the fields below.
	mu sync.Mutex
	// events are the events of each sandbox, oldest first.
	events map[string][]api.SandboxEvent
}

var (
	_ sandbox.Extension   = (*Recorder)(nil)
	_ sandbox.Provisioner = (*Recorder)(nil)
	_ sandbox.Observer    = (*Recorder)(nil)
	_ sandbox.DeleteHook  = (*Recorder)(nil)
)

// New returns a Recorder. cfg.Logger is required.
func New(cfg Config) *Recorder {
	return &Recorder{cfg: cfg, events: map[string][]api.SandboxEvent{}}
}

// Name implements sandbox.Extension.
func (r *Recorder) Name() string { return "sandboxevents" }

// Provision implements sandbox.Provisioner.
func (r *Recorder) Provision(c sandbox.Core) error {
	r.core = c
	return nil
}

// Observe implements sandbox.Observer: it keeps the events the core
// reports (the core has logged them).
func (r *Recorder) Observe(ctx context.Context, op sandbox.Op) {
	if op.Kind == sandbox.OpEvent && op.Event != nil {
		r.add(*op.Event)
	}
}

// OnDelete implements sandbox.DeleteHook: a deleted sandbox's events are
// forgotten.
func (r *Recorder) OnDelete(ctx context.Context, id string) {
	r.mu.Lock()
	delete(r.events, id)
	r.mu.Unlock()
}

func (r *Recorder) add(ev api.SandboxEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	buf := append(r.events[ev.SandboxID], ev)
	if len(buf) > maxSandboxEvents {
		buf = append([]api.SandboxEvent(nil), buf[len(buf)-maxSandboxEvents:]...)
	}
	r.events[ev.SandboxID] = buf
}

// RecordEvent records ev for ev.SandboxID. The sender's identity (sandbox,
// run) must already be verified (runsecrets.Secrets.AuthorizeRun); the
// caller sets it.
func (r *Recorder) RecordEvent(ctx context.Context, ev api.SandboxEvent) error {
	if err := validEvent(ev); err != nil {
		return err
	}
	if _, err := r.core.Handle(ctx, ev.SandboxID); err != nil {
		return err
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if r.cfg.Redactor != nil {
		if red := r.cfg.Redactor(ev.SandboxID); red != nil {
			ev.Message = red.RedactString(ev.Message)
			ev.Name = red.RedactString(ev.Name)
			attrs := make(map[string]string, len(ev.Attrs))
			for k, v := range ev.Attrs {
				attrs[red.RedactString(k)] = red.RedactString(v)
			}
			ev.Attrs = attrs
		}
	}
	r.add(ev)
	if r.cfg.OnRecord != nil {
		r.cfg.OnRecord(ev)
	}
	r.cfg.Logger.InfoContext(ctx, "sandbox event", "sandbox", ev.SandboxID, "run", ev.RunID, "type", ev.Type,
		"name", ev.Name, "value", ev.Value, "message", ev.Message, "attrs", ev.Attrs)
	return nil
}

// SandboxEvents returns the recorded events of sandbox id, oldest first.
func (r *Recorder) SandboxEvents(ctx context.Context, id string) ([]api.SandboxEvent, error) {
	if _, err := r.core.Handle(ctx, id); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]api.SandboxEvent, len(r.events[id]))
	copy(out, r.events[id])
	return out, nil
}

// validEvent checks an event sent from inside a sandbox.
func validEvent(ev api.SandboxEvent) error {
	switch ev.Type {
	case api.SandboxEventLog, api.SandboxEventMetric, api.SandboxEventUsage:
	default:
		return fmt.Errorf("event type %q must be log, metric or usage: %w", ev.Type, errdefs.ErrInvalidArgument)
	}
	if len(ev.Message) > 8<<10 || len(ev.Name) > 256 || len(ev.Attrs) > 32 {
		return fmt.Errorf("event too large (message 8 KiB, name 256 bytes, 32 attrs): %w", errdefs.ErrInvalidArgument)
	}
	for k, v := range ev.Attrs {
		if len(k) > 128 || len(v) > 1024 {
			return fmt.Errorf("event attribute too large (key 128, value 1024 bytes): %w", errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
