package test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
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
	benchDriverSizes(b, benchCheckpoint)
}

func BenchmarkRestoreDriver(b *testing.B) {
	benchDriverSizes(b, benchRestore)
}

// benchDriverSizes runs bench (benchCheckpoint, benchRestore) on a daemon
// of each storage driver for each of changeSizes, deleting its sandbox
// after.
func benchDriverSizes(b *testing.B, bench func(*testing.B, *daemon, int) *agentbox.Sandbox) {
	ctx := context.Background()
	for _, drv := range benchDrivers {
		b.Run(drv.name, func(b *testing.B) {
			d := newDaemonIn(b, drv.mnt(b))
			for _, mib := range changeSizes {
				b.Run(fmt.Sprintf("%dMB", mib), func(b *testing.B) {
					sb := bench(b, d, mib)
					_ = sb.Delete(ctx)
				})
			}
		})
	}
}
