package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The core fails closed without the checkpoint feature: an exec asking for
// a transaction is refused, never run without its checkpoint.
func TestExecTransactionRefusedWithoutFeature(t *testing.T) {
	m := &Manager{cfg: Config{Clock: clock.Real{}}}
	for _, req := range []api.ExecRequest{{Cmd: []string{"true"}, CheckpointBefore: true}, {Cmd: []string{"true"}, RollbackOnFailure: true}} {
		if _, err := m.Exec(context.Background(), "sb", req); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%+v without the checkpoint feature: %v, want failed precondition", req, err)
		}
	}
}
