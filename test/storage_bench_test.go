package test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// Checkpoint and restore per storage driver: copy on the suite's temp dir
// (ext4 here), reflink on an xfs (reflink=1) and a btrfs file system the
// benchmark creates in a loop file. Needs root and mkfs.xfs / mkfs.btrfs
// (apt: xfsprogs, btrfs-progs). Run:
//
//	go test -run '^$' -bench 'Driver' -benchtime 10x ./test/

var benchDrivers = []struct {
	name string
	mnt  func(b *testing.B) string // "" = the suite's temp dir
}{
	{"copy-ext4", func(b *testing.B) string { return "" }},
	{"reflink-xfs", func(b *testing.B) string { return testutil.LoopFS(b, "xfs", 4096) }},
	{"reflink-btrfs", func(b *testing.B) string { return testutil.LoopFS(b, "btrfs", 4096) }},
}

func BenchmarkCheckpointDriver(b *testing.B) {
	ctx := context.Background()
	for _, drv := range benchDrivers {
		b.Run(drv.name, func(b *testing.B) {
			d := newDaemonIn(b, drv.mnt(b))
			for _, mib := range changeSizes {
				b.Run(fmt.Sprintf("%dMB", mib), func(b *testing.B) {
					sb := benchSandbox(b, d, mib)
					b.ResetTimer()
					for i := range b.N {
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
					_ = sb.Delete(ctx)
				})
			}
		})
	}
}

func BenchmarkRestoreDriver(b *testing.B) {
	ctx := context.Background()
	for _, drv := range benchDrivers {
		b.Run(drv.name, func(b *testing.B) {
			d := newDaemonIn(b, drv.mnt(b))
			for _, mib := range changeSizes {
				b.Run(fmt.Sprintf("%dMB", mib), func(b *testing.B) {
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
					_ = sb.Delete(ctx)
				})
			}
		})
	}
}
