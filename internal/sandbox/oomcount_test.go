package sandbox

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
)

// statsSandbox reports its counters through Stats only, and counts calls.
type statsSandbox struct {
	runtime.Sandbox
	kills, calls int64
}

func (s *statsSandbox) Stats(context.Context) (runtime.Stats, error) {
	s.calls++
	return runtime.Stats{OOMKills: s.kills, Pids: 7}, nil
}

// counterSandbox also has the cheap counters (as gvisor's, whose Stats
// runs a runsc subprocess).
type counterSandbox struct {
	statsSandbox
	counted int64
}

func (s *counterSandbox) Counters(context.Context) (runtime.Stats, error) {
	s.counted++
	return runtime.Stats{OOMKills: s.kills}, nil
}

// TestCountersPreferCounterReader: what the core samples around every
// exec (the OOM count; the run record's CPU time through Handle.Stats)
// comes from runtime.CounterReader when the sandbox has one, never from
// its Stats, and from Stats otherwise.
func TestCountersPreferCounterReader(t *testing.T) {
	var m Manager
	c := &counterSandbox{statsSandbox: statsSandbox{kills: 3}}
	if n, ok := m.oomKills(&box{rt: c}); !ok || n != 3 {
		t.Errorf("oomKills with counters = %d, %v; want 3, true", n, ok)
	}
	h := &Handle{b: &box{rt: c}}
	if st, err := h.Stats(context.Background()); err != nil || st.OOMKills != 3 {
		t.Errorf("Handle.Stats with counters = %+v, %v", st, err)
	}
	if c.calls != 0 || c.counted != 2 {
		t.Errorf("Stats called %d times, Counters %d; want 0 and 2", c.calls, c.counted)
	}
	s := &statsSandbox{kills: 2}
	if n, ok := m.oomKills(&box{rt: s}); !ok || n != 2 || s.calls != 1 {
		t.Errorf("oomKills through Stats = %d, %v after %d calls; want 2, true, 1", n, ok, s.calls)
	}
	if _, ok := m.oomKills(&box{}); ok {
		t.Error("oomKills of a sandbox without a runtime sandbox reported a count")
	}
}
