package pipeline

import (
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime"
)

// gib is the "GB" of memory GB-seconds.
const gib = 1 << 30

// meter integrates a sandbox's cgroup counters over one run: CPU time is
// the sum of the counter's increases between samples (a counter that went
// down was reset by a guest restart and counts from zero), memory the
// trapezoidal integral of the sampled memory use over time. Samples
// without counters (the sandbox asleep, or no stats support) are skipped.
// Not safe for concurrent use; runState guards it.
type meter struct {
	last           *runtime.Stats
	lastAt         time.Time
	cpu            time.Duration
	memByteSeconds float64
}

func (m *meter) sampled() bool { return m.last != nil }

func (m *meter) sample(at time.Time, st *runtime.Stats) {
	if st == nil {
		return
	}
	if m.last != nil {
		if d := st.CPUTime - m.last.CPUTime; d >= 0 {
			m.cpu += d
		} else {
			m.cpu += st.CPUTime
		}
		if dt := at.Sub(m.lastAt).Seconds(); dt > 0 {
			m.memByteSeconds += float64(st.MemoryBytes+m.last.MemoryBytes) / 2 * dt
		}
	}
	s := *st
	m.last, m.lastAt = &s, at
}

func (m *meter) usage() api.RunUsage {
	return api.RunUsage{
		CPUSeconds:      m.cpu.Seconds(),
		MemoryGBSeconds: m.memByteSeconds / gib,
	}
}
