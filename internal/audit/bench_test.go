package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
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
