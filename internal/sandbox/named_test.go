package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// A name is never shaped like an id (so never another sandbox's id), and
// every id newID makes is refused as a name.
func TestValidName(t *testing.T) {
	for _, ok := range []string{"web1", "hermes", "nightly-3f2a", "abcdef12345", "abcdef1234567", "abcdef-12345"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Web1", "-web", "abcdef123456", "000000000000", newID()} {
		if err := ValidName(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidName(%q) = %v, want invalid argument", bad, err)
		}
	}
}

// Create by an existing name returns the sandbox when the request asks for
// nothing it lacks, and is a conflict naming each option that differs
// otherwise; an idle override is compared over the sandbox's own preset.
func TestCreateByNameComparesOptions(t *testing.T) {
	m, _, _ := newTestManager(t)
	ctx := context.Background()
	req := api.CreateSandboxRequest{Name: "dev", Lifecycle: api.LifecyclePersistent, Env: map[string]string{"A": "1"},
		Labels: map[string]string{"k": "v"}, Idle: &api.IdlePolicy{PauseAfterSeconds: 60}}
	id := createTest(t, m, req)
	h, err := m.Handle(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Update(ctx, func(sb *api.Sandbox) { sb.Env, sb.Labels = map[string]string{"A": "1", "PATH": "/bin"}, req.Labels }); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox()
	for _, same := range []api.CreateSandboxRequest{
		{Name: "dev"},
		req,
		{Name: "dev", Idle: &api.IdlePolicy{PauseAfterSeconds: 60}}, // over the persistent preset, as the sandbox has it
	} {
		got, created, err := m.CreateOrGetSandbox(ctx, same)
		if err != nil || created || got.ID != sb.ID {
			t.Errorf("create by name %+v: %s %v %v, want the existing %s", same, got.ID, created, err, sb.ID)
		}
	}
	_, _, err = m.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "dev", Lifecycle: api.LifecycleSession,
		Env: map[string]string{"A": "2"}, Labels: map[string]string{"k": "w"}, Hostname: "other", Idle: &api.IdlePolicy{PauseAfterSeconds: 90}})
	if !errdefs.IsConflict(err) {
		t.Fatalf("create by name with other options: %v, want conflict", err)
	}
	for _, option := range []string{"lifecycle", "env: A", "labels", "hostname", "idle"} {
		if !strings.Contains(err.Error(), option) {
			t.Errorf("conflict %q does not name %s", err, option)
		}
	}
}
