package test

import (
	"context"
	"slices"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// BenchmarkExecRecording measures the exec round trip (a foreground
// `true`, request to exit event) with the flight recorder on and off: two
// daemons, alternating blocks of execs, so drift hits both alike. It
// reports both medians and the overhead (target: at most 10 % added p50).
// "files" has 2,000 files in the sandbox's writable layer, which the
// recorder lists before and after every run.
func BenchmarkExecRecording(b *testing.B) {
	for _, bc := range []struct {
		name  string
		files int
	}{{"empty", 0}, {"files", 2000}} {
		b.Run(bc.name, func(b *testing.B) {
			off := newDaemonWith(b, "--no-audit")
			on := newDaemon(b)
			ctx := context.Background()
			sbs := []*agentbox.Sandbox{off.create(b, agentbox.SandboxSpec{}), on.create(b, agentbox.SandboxSpec{})}
			for _, sb := range sbs {
				if bc.files > 0 {
					mustRun(b, sb, "mkdir -p /root/tree && cd /root/tree && i=0; while [ $i -lt 2000 ]; do echo $i > f$i; i=$((i+1)); done")
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
			times := [2][]time.Duration{}
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
			offMS, onMS := p50(times[0]), p50(times[1])
			b.ReportMetric(offMS, "p50-off-ms")
			b.ReportMetric(onMS, "p50-on-ms")
			b.ReportMetric(100*(onMS-offMS)/offMS, "overhead-%")
		})
	}
}
