package sandboxevents

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// fakeCore knows the sandboxes in ids.
type fakeCore struct{ ids map[string]bool }

func (c fakeCore) Handle(ctx context.Context, id string) (*sandbox.Handle, error) {
	if !c.ids[id] {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return nil, nil
}

func (c fakeCore) Acquire(ctx context.Context, id string) (*sandbox.Handle, func(), error) {
	return nil, nil, errdefs.ErrNotImplemented
}

func (c fakeCore) WithGuest(ctx context.Context, id, op string, fn func(*client.Client) error) error {
	return errdefs.ErrNotImplemented
}

func newRecorder(t *testing.T, redactor func(string) *redact.Redactor, ids ...string) *Recorder {
	t.Helper()
	known := map[string]bool{}
	for _, id := range ids {
		known[id] = true
	}
	r := New(Config{Redactor: redactor, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := r.Provision(fakeCore{known}); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecordEventRedactsAndKeeps(t *testing.T) {
	red := func(id string) *redact.Redactor {
		return redact.New(map[string][]byte{"tok": []byte("s3cretvalue")})
	}
	r := newRecorder(t, red, "sb1")
	ctx := context.Background()
	ev := api.SandboxEvent{SandboxID: "sb1", Type: api.SandboxEventLog, Message: "key s3cretvalue here", Attrs: map[string]string{"k": "s3cretvalue"}}
	if err := r.RecordEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	evs, err := r.SandboxEvents(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || strings.Contains(evs[0].Message, "s3cretvalue") || strings.Contains(evs[0].Attrs["k"], "s3cretvalue") {
		t.Fatalf("events = %+v, want one, redacted", evs)
	}
	if evs[0].Time.IsZero() {
		t.Error("event time not set")
	}
}

func TestRecordEventRefusesBadAndUnknown(t *testing.T) {
	r := newRecorder(t, nil, "sb1")
	ctx := context.Background()
	if err := r.RecordEvent(ctx, api.SandboxEvent{SandboxID: "sb1", Type: "oom"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("event of type oom from inside: %v, want invalid argument", err)
	}
	if err := r.RecordEvent(ctx, api.SandboxEvent{SandboxID: "sb1", Type: api.SandboxEventLog, Message: strings.Repeat("x", 9<<10)}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("oversized event: %v, want invalid argument", err)
	}
	if err := r.RecordEvent(ctx, api.SandboxEvent{SandboxID: "other", Type: api.SandboxEventLog}); !errdefs.IsNotFound(err) {
		t.Errorf("event of an unknown sandbox: %v, want not found", err)
	}
	if _, err := r.SandboxEvents(ctx, "other"); !errdefs.IsNotFound(err) {
		t.Errorf("events of an unknown sandbox: %v, want not found", err)
	}
}

func TestObservedEventsBoundedAndForgotten(t *testing.T) {
	r := newRecorder(t, nil, "sb1")
	ctx := context.Background()
	for i := range maxSandboxEvents + 5 {
		ev := api.SandboxEvent{SandboxID: "sb1", Type: api.SandboxEventOOM, Value: float64(i)}
		r.Observe(ctx, sandbox.Op{Kind: sandbox.OpEvent, Sandbox: "sb1", Event: &ev})
	}
	r.Observe(ctx, sandbox.Op{Kind: sandbox.OpExec, Sandbox: "sb1"}) // not an event: ignored
	evs, err := r.SandboxEvents(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != maxSandboxEvents || evs[0].Value != 5 {
		t.Fatalf("%d events, first %v; want %d, oldest dropped first", len(evs), evs[0].Value, maxSandboxEvents)
	}
	r.OnDelete(ctx, "sb1")
	if evs, _ := r.SandboxEvents(ctx, "sb1"); len(evs) != 0 {
		t.Errorf("%d events after delete, want none", len(evs))
	}
}
