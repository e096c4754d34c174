package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// BenchmarkExecRecording measures the exec round trip (a foreground
// `true`, request to exit event) with the flight recorder off, on (its
// change tracker following the writable layer) and on walking the layer
// before and after each run (--audit-walk): three daemons, alternating
// blocks of execs, so drift hits all alike. It reports the medians and
// the overhead of recording (target: at most 10 % added p50). "files2k"
// and "files20k" have 2,000 and 20,000 files in the sandbox's writable
// layer.
func BenchmarkExecRecording(b *testing.B) {
	for _, bc := range []struct {
		name  string
		files int
	}{{"empty", 0}, {"files2k", 2000}, {"files20k", 20000}} {
		b.Run(bc.name, func(b *testing.B) {
			off := newDaemonWith(b, "--no-audit")
			on := newDaemon(b)
			walk := newDaemonWith(b, "--audit-walk")
			ctx := context.Background()
			sbs := []*agentbox.Sandbox{off.create(b, agentbox.SandboxSpec{}), on.create(b, agentbox.SandboxSpec{}), walk.create(b, agentbox.SandboxSpec{})}
			for _, sb := range sbs {
				if bc.files > 0 {
					mustRun(b, sb, fmt.Sprintf("mkdir -p /root/tree && cd /root/tree && i=0; while [ $i -lt %d ]; do echo $i > f$i; i=$((i+1)); done", bc.files))
				}
				for range 5 {
					mustRun(b, sb, "true")
				}
			}
			// Blocks of back-to-back execs on one daemon, alternating: the
			// recorder's work after an exit (listing the layer, recording
			// the run's effects) is waited for by the sandbox's next exec,
			// and must not hide behind the other daemon's exec.
			const block = 10
			times := [3][]time.Duration{}
			b.ResetTimer()
			for n := 0; n < b.N; n += block {
				for i, sb := range sbs {
					for range min(block, b.N-n) {
						start := time.Now()
						if _, err := sb.Run(ctx, "true"); err != nil {
							b.Fatal(err)
						}
						times[i] = append(times[i], time.Since(start))
					}
				}
			}
			b.StopTimer()
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Microseconds()) / 1000
			}
			offMS, onMS, walkMS := p50(times[0]), p50(times[1]), p50(times[2])
			b.ReportMetric(offMS, "p50-off-ms")
			b.ReportMetric(onMS, "p50-on-ms")
			b.ReportMetric(walkMS, "p50-walk-ms")
			b.ReportMetric(100*(onMS-offMS)/offMS, "overhead-%")
			b.ReportMetric(100*(walkMS-offMS)/offMS, "walk-overhead-%")
		})
	}
}
