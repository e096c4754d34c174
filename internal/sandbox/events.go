package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Events programs inside a sandbox send through the API bridge (log, metric
// and usage records) land here: one log line each and a bounded per-sandbox
// buffer queryable through the API. Secret values the sandbox's runs were
// given are redacted from them first, like from exec output.

// maxSandboxEvents is the size of each sandbox's event buffer; the oldest
// events are dropped first.
const maxSandboxEvents = 1000

// RecordEvent records ev for ev.SandboxID. The sender's identity (sandbox,
// run) must already be verified (AuthorizeRun); the caller sets it.
func (m *Manager) RecordEvent(ctx context.Context, ev api.SandboxEvent) error {
	if err := validEvent(ev); err != nil {
		return err
	}
	if _, err := m.get(ctx, ev.SandboxID); err != nil {
		return err
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if red := m.redactor(ev.SandboxID); red != nil {
		ev.Message = red.RedactString(ev.Message)
		ev.Name = red.RedactString(ev.Name)
		attrs := make(map[string]string, len(ev.Attrs))
		for k, v := range ev.Attrs {
			attrs[red.RedactString(k)] = red.RedactString(v)
		}
		ev.Attrs = attrs
	}
	m.sec.mu.Lock()
	if m.sec.events == nil {
		m.sec.events = map[string][]api.SandboxEvent{}
	}
	buf := append(m.sec.events[ev.SandboxID], ev)
	if len(buf) > maxSandboxEvents {
		buf = append([]api.SandboxEvent(nil), buf[len(buf)-maxSandboxEvents:]...)
	}
	m.sec.events[ev.SandboxID] = buf
	m.sec.mu.Unlock()
	m.log.InfoContext(ctx, "sandbox event", "sandbox", ev.SandboxID, "run", ev.RunID, "type", ev.Type,
		"name", ev.Name, "value", ev.Value, "message", ev.Message, "attrs", ev.Attrs)
	return nil
}

// SandboxEvents returns the recorded events of sandbox id, oldest first.
func (m *Manager) SandboxEvents(ctx context.Context, id string) ([]api.SandboxEvent, error) {
	if _, err := m.get(ctx, id); err != nil {
		return nil, err
	}
	m.sec.mu.Lock()
	defer m.sec.mu.Unlock()
	for sid := range m.sec.events {
		if _, err := m.get(ctx, sid); err != nil {
			delete(m.sec.events, sid) // sandbox gone: forget its events
		}
	}
	out := make([]api.SandboxEvent, len(m.sec.events[id]))
	copy(out, m.sec.events[id])
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
