package upgrade

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type fakeSandboxes struct {
	ops      []sandbox.Op
	upgraded int
}

func (f *fakeSandboxes) UpgradeGuest(ctx context.Context, id string, rn runner.Runner) (api.UpgradeResult, error) {
	f.upgraded++
	return api.UpgradeResult{}, nil
}

func (f *fakeSandboxes) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	return nil, nil
}

func (f *fakeSandboxes) Report(ctx context.Context, op sandbox.Op) { f.ops = append(f.ops, op) }

// A request naming no valid runner is refused before the sandbox is
// touched, and observers still see the failed upgrade.
func TestUpgradeSandboxRefusesBadRequests(t *testing.T) {
	for _, req := range []api.UpgradeRequest{
		{Runner: "/opt/agentbox", RunnerHash: "0123456789abcdef"},
		{Runner: "relative/agentbox"},
	} {
		f := &fakeSandboxes{}
		u := New(Config{RunnerDir: t.TempDir() + "/0123456789abcdef", Sandboxes: f})
		_, err := u.UpgradeSandbox(context.Background(), "sb1", req)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", req, err)
		}
		if f.upgraded != 0 {
			t.Errorf("%+v: the core was asked to upgrade", req)
		}
		if len(f.ops) != 1 || f.ops[0].Kind != sandbox.OpUpgrade || f.ops[0].Sandbox != "sb1" || f.ops[0].Err == nil {
			t.Errorf("%+v: observers saw %+v, want one failed upgrade of sb1", req, f.ops)
		}
	}
}
