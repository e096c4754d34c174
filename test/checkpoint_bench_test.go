package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Benchmarks of the undo path against the real daemon (copy driver: the
// data dir's filesystem, usually ext4). Run:
//
//	go test -run '^$' -bench 'Checkpoint|Restore|Fork|CreateOne' -benchtime 5x ./test/

var changeSizes = []int{10, 200} // MiB written into the sandbox's writable layer

func benchSandbox(b *testing.B, d *daemon, mib int) *agentbox.Sandbox {
	b.Helper()
	sb := d.create(b, agentbox.SandboxSpec{})
	mustRun(b, sb, fmt.Sprintf("mkdir -p /root/w && for i in $(seq %d); do dd if=/dev/urandom of=/root/w/f$i bs=1M count=1 2>/dev/null; done", mib))
	return sb
}

func BenchmarkCheckpoint(b *testing.B) {
	d := newDaemon(b)
	for _, mib := range changeSizes {
		b.Run(fmt.Sprintf("%dMB", mib), func(b *testing.B) {
			b.SetBytes(int64(mib) << 20)
			benchCheckpoint(b, d, mib)
		})
	}
}

func BenchmarkRestore(b *testing.B) {
	d := newDaemon(b)
	for _, mib := range changeSizes {
		b.Run(fmt.Sprintf("%dMB", mib), func(b *testing.B) {
			benchRestore(b, d, mib)
		})
	}
}

// benchCheckpoint times b.N checkpoints of a sandbox of d with mib MiB
// written (benchSandbox), deleting each checkpoint untimed, and returns
// the sandbox with the timer stopped.
func benchCheckpoint(b *testing.B, d *daemon, mib int) *agentbox.Sandbox {
	ctx := context.Background()
	sb := benchSandbox(b, d, mib)
	b.ResetTimer()
	for i := range b.N {
		// A new byte each round: a new layer, never a cache hit.
		b.StopTimer()
		mustRun(b, sb, fmt.Sprintf("echo %d > /root/round", i))
		b.StartTimer()
		ck, err := sb.Checkpoint(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		b.ReportMetric(float64(ck.DurationMS), "frozen-ms")
		if err := d.client.DeleteCheckpoint(ctx, ck.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	return sb
}

// benchRestore times b.N restores of a checkpoint of a sandbox of d with
// mib MiB written, each after an untimed change to undo, checks the last
// restore took, and returns the sandbox with the timer stopped.
func benchRestore(b *testing.B, d *daemon, mib int) *agentbox.Sandbox {
	ctx := context.Background()
	sb := benchSandbox(b, d, mib)
	ck, err := sb.Checkpoint(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		mustRun(b, sb, "rm -rf /root/w /bin/ls")
		b.StartTimer()
		if _, err := sb.Restore(ctx, ck.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	mustRun(b, sb, "test -e /root/w/f1 && test -e /bin/ls")
	return sb
}

// BenchmarkForkTen and BenchmarkCreateOne compare ten forks of a checkpoint
// with one plain create.
func BenchmarkForkTen(b *testing.B) {
	d := newDaemon(b)
	ctx := context.Background()
	sb := benchSandbox(b, d, 10)
	ck, err := sb.Checkpoint(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		forks, err := d.client.Fork(ctx, ck.ID, 10)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, f := range forks {
			if err := f.Delete(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
}

func BenchmarkCreateOne(b *testing.B) {
	d := newDaemon(b)
	ctx := context.Background()
	d.create(b, agentbox.SandboxSpec{}) // builds the template
	b.ResetTimer()
	for range b.N {
		sb, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := sb.Delete(ctx); err != nil {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // let the backend refill its spares
		b.StartTimer()
	}
}
