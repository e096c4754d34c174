package sandbox_test

import (
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock/clocktest"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
)

// Under the default policy a running background process keeps a sandbox
// awake (it is neither paused nor hibernated however long it is idle); a
// sandbox paused by hand while one ran is not hibernated by the policy;
// once it has ended the policy applies again.
func TestInprocIdleKeepsBackgroundAwake(t *testing.T) {
	clk := clocktest.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	h := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) { c.Clock = clk })
	ctx := ctxT(t)
	files := sandboxfiles.New(h.M)
	sb := h.Create(api.CreateSandboxRequest{Lifecycle: api.LifecyclePersistent, Idle: &api.IdlePolicy{PauseAfterSeconds: 60, HibernateAfterSeconds: 120}})
	p, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		clk.Advance(60 * time.Second)
		if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StateRunning {
			t.Fatalf("after %ds idle with a background process: %s", 60*i, got.State)
		}
	}
	if len(inproc.Processes(sb.ID)) == 0 {
		t.Fatal("the background process is gone")
	}

	if _, err := h.M.SetState(ctx, sb.ID, api.StatePaused); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		clk.Advance(120 * time.Second)
		if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StatePaused {
			t.Fatalf("paused with a background process, after %ds: %s", 120*i, got.State)
		}
	}
	if _, err := h.M.SetState(ctx, sb.ID, api.StateRunning); err != nil {
		t.Fatal(err)
	}

	if err := files.Signal(ctx, sb.ID, p.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	sandboxtest.WaitFor(t, "the background process to exit", func() bool {
		ps, err := files.ListProcesses(ctx, sb.ID)
		return err == nil && len(ps) == 1 && !ps[0].Running
	})
	clk.Advance(60 * time.Second)
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StatePaused {
		t.Fatalf("60s after the background process ended: %s", got.State)
	}
	clk.Advance(60 * time.Second)
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StateHibernated {
		t.Fatalf("120s after the background process ended: %s", got.State)
	}
}
