package test

import (
	"context"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// BenchmarkPoolClaim measures a create served from a warm pool (target:
// p50 ≤ 2 ms) and create→first exec with a warm pool, through the real
// daemon and the Go SDK. The pool refills (untimed) between iterations.
func BenchmarkPoolClaim(b *testing.B) {
	d := newDaemonWith(b, "--warm-pool", "busybox=2")
	ctx := context.Background()
	for _, withExec := range []bool{false, true} {
		name := "claim"
		if withExec {
			name = "claim+exec"
		}
		b.Run(name, func(b *testing.B) {
			var samples []time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				waitPool(b, d.client, "busybox", 2)
				b.StartTimer()
				start := time.Now()
				sb, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
				if err != nil {
					b.Fatal(err)
				}
				if withExec {
					if res, err := sb.Run(ctx, "true"); err != nil || res.ExitCode != 0 {
						b.Fatalf("first exec: %v %+v", err, res)
					}
				}
				samples = append(samples, time.Since(start))
				b.StopTimer()
				if err := sb.Delete(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "p50-ms")
		})
	}
	if log, err := os.ReadFile(d.logPath); err == nil {
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, "from warm pool") {
				b.Log(l[strings.Index(l, "sandbox="):])
			}
		}
	}
}
