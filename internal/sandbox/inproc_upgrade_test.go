package sandbox_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
)

// LayersInUse names the top layer of every sandbox, for the collector.
func TestInprocLayersInUse(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	h.Create(api.CreateSandboxRequest{})
	tops, err := h.M.LayersInUse(ctx)
	if err != nil || !slices.Contains(tops, h.Base.Path) {
		t.Fatalf("LayersInUse = %v, %v; want the base layer %s", tops, err, h.Base.Path)
	}
}

// A guest that reports another build than the runner it was started on
// is replaced by the previous guest: the sandbox keeps running on its
// runner and the upgrade fails with ErrFailedPrecondition. Upgrading to
// the runner the sandbox runs already changes nothing.
func TestInprocUpgradeGuestRollsBack(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	_, err := h.M.UpgradeGuest(ctx, sb.ID, runner.Runner{Hash: "0123456789abcdef", Version: "v-other", Build: "other"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("upgrade to a guest of the wrong build: %v, want ErrFailedPrecondition", err)
	}
	got, err := h.M.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.Runner != sb.Runner {
		t.Fatalf("after the rollback: %+v, %v; want running on runner %s", got, err, sb.Runner)
	}
	s, err := h.M.Exec(ctx, sb.ID, api.ExecRequest{Command: "echo ok"})
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Drain(t, s); r.Code != 0 || r.Stdout != "ok\n" {
		t.Fatalf("exec after the rollback = %+v", r)
	}
	res, err := h.M.UpgradeGuest(ctx, sb.ID, runner.Runner{Hash: got.Runner, Version: got.GuestVersion})
	if err != nil || res.Changed {
		t.Fatalf("upgrade to its own runner = %+v, %v; want no change", res, err)
	}
}
