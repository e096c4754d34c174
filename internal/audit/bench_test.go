package audit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
)

// BenchmarkScanUpper lists a writable layer of 2,000 files (the work the
// recorder does before and after every run).
func BenchmarkScanUpper(b *testing.B) {
	dir := b.TempDir()
	for i := range 2000 {
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i%20))
		os.MkdirAll(sub, 0o755)
		os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", i)), []byte("x"), 0o644)
	}
	b.ResetTimer()
	for range b.N {
		if l := scanUpper(dir, defaultScanLimits.Entries); len(l.files) != 2020 {
			b.Fatal(len(l.files))
		}
	}
}

// BenchmarkTrackedRun is the change tracker's work for one run that
// changes one file in a layer of 20,000 (begin, the change, the barrier
// and the comparison of what changed): what replaces two listings. The
// layer is on a filesystem of its own, as under loop-device disk quotas
// (on a shared one, the tracker also reads the rest of its traffic).
func BenchmarkTrackedRun(b *testing.B) {
	testutil.RequiresRoot(b)
	dir := testutil.LoopFS(b, "ext4", 512)
	trk, err := startTracker(filepath.Join(b.TempDir(), "track"), defaultScanLimits.Tracked, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer trk.close()
	upper := filepath.Join(dir, "upper")
	for i := range 20000 {
		sub := filepath.Join(upper, fmt.Sprintf("d%d", i%20))
		os.MkdirAll(sub, 0o755)
		os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", i)), []byte("x"), 0o644)
	}
	ctx := context.Background()
	if err := trk.begin(ctx, upper, true); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := trk.begin(ctx, upper, false); err != nil {
			b.Fatal(err)
		}
		os.WriteFile(filepath.Join(upper, "d7", "f7"), []byte(fmt.Sprint(i)), 0o644)
		changes, walked, err := trk.end(ctx, upper)
		if err != nil || walked || len(changes) != 1 {
			b.Fatalf("%d changes, walked %v, %v", len(changes), walked, err)
		}
	}
}

// BenchmarkAppend measures events recorded per second into one sandbox's
// record (heads signed every DefaultSignEvery events).
func BenchmarkAppend(b *testing.B) {
	s := openTestStore(b, Limits{MaxEvents: 1 << 40, MaxBytes: 1 << 40})
	ev := api.SandboxEvent{SandboxID: "sb1", Type: api.EventRunEnded, RunID: "run_0123456789abcdef01234567",
		Run: &api.RunEvent{Outcome: "ok", DurationMS: 3.2, OutputBytes: 120, OutputSHA256: "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", Excerpt: "hello world"}}
	b.ResetTimer()
	for range b.N {
		if _, err := s.Append("acme", ev); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkVerify100k measures `audit verify` of a record of 100,000
// events.
func BenchmarkVerify100k(b *testing.B) {
	s := openTestStore(b, Limits{MaxEvents: 1 << 40, MaxBytes: 1 << 40})
	appendN(b, s, "sb1", 100_000)
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		res, err := s.Verify("sb1")
		if err != nil || !res.OK || res.Events != 100_000 {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/verify")
}
