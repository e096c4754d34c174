package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// SetTimeout moves the end of the hard lifetime (or gives one); a
// sleeping sandbox keeps the new lifetime for when it wakes.
func TestSetTimeout(t *testing.T) {
	m, clk, _ := newTestManager(t)
	ctx := context.Background()
	never := &api.IdlePolicy{PauseAfterSeconds: -1, DeleteAfterSeconds: -1}
	id := createTest(t, m, api.CreateSandboxRequest{TimeoutSeconds: 100, Idle: never})
	clk.Advance(90 * time.Second)
	sb, err := m.SetTimeout(ctx, id, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("expires_at %v, want now+1m", sb.ExpiresAt)
	}
	clk.Advance(30 * time.Second) // past the old end
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("deleted at the old end: %s", s)
	}
	if _, err := m.SetState(ctx, id, api.StatePaused); err != nil {
		t.Fatal(err)
	}
	if _, err := m.SetTimeout(ctx, id, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if s := state(t, m, id); s != api.StatePaused {
		t.Fatalf("asleep with a new timeout: %s", s)
	}
	sb, err = m.SetState(ctx, id, api.StateRunning)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(clk.Now().Add(10*time.Second)) {
		t.Fatalf("expires_at after resume %v, want now+10s", sb.ExpiresAt)
	}
	clk.Advance(10 * time.Second)
	if _, err := m.GetSandbox(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("not deleted at the end of its new lifetime: %v", err)
	}

	// A sandbox without a lifetime gets one; bad durations are refused.
	id = createTest(t, m, api.CreateSandboxRequest{Idle: never})
	if _, err := m.SetTimeout(ctx, id, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("timeout 0: %v", err)
	}
	if _, err := m.SetTimeout(ctx, "nosuchsandbx", time.Second); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: %v", err)
	}
	if _, err := m.SetTimeout(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Second)
	if _, err := m.GetSandbox(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("not deleted at the end of its given lifetime: %v", err)
	}
}
