package sandbox

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
)

// statsSandbox reports OOM kills through Stats only, and counts its calls.
type statsSandbox struct {
	runtime.Sandbox
	kills, calls int64
}

func (s *statsSandbox) Stats(context.Context) (runtime.Stats, error) {
	s.calls++
	return runtime.Stats{OOMKills: s.kills, Pids: 1}, nil
}

// counterSandbox also has the cheap counter.
type counterSandbox struct {
	statsSandbox
	counted int64
}

func (s *counterSandbox) OOMKills(context.Context) (int64, error) {
	s.counted++
	return s.kills, nil
}

// TestOOMKillsPrefersCounter: the OOM count sampled around every exec
// comes from runtime.OOMCounter when the sandbox has one, never from its
// Stats (gvisor's costs a runsc subprocess), and from Stats otherwise.
func TestOOMKillsPrefersCounter(t *testing.T) {
	var m Manager
	c := &counterSandbox{statsSandbox: statsSandbox{kills: 3}}
	if n, ok := m.oomKills(&box{rt: c}); !ok || n != 3 {
		t.Errorf("oomKills with a counter = %d, %v; want 3, true", n, ok)
	}
	if c.calls != 0 || c.counted != 1 {
		t.Errorf("Stats called %d times, OOMKills %d; want 0 and 1", c.calls, c.counted)
	}
	s := &statsSandbox{kills: 2}
	if n, ok := m.oomKills(&box{rt: s}); !ok || n != 2 || s.calls != 1 {
		t.Errorf("oomKills through Stats = %d, %v after %d calls; want 2, true, 1", n, ok, s.calls)
	}
	if _, ok := m.oomKills(&box{}); ok {
		t.Error("oomKills of a sandbox without a runtime sandbox reported a count")
	}
}
