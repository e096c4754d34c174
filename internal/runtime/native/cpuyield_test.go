package native

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestYieldStateNext(t *testing.T) {
	type step struct {
		share float64
		want  bool
	}
	for name, steps := range map[string][]step{
		"a busy window yields":            {{0.95, true}},
		"idle stays":                      {{0, false}, {0.3, false}, {0.89, false}},
		"stays yielding above leave":      {{1, true}, {0.6, true}, {0.5, true}, {0.95, true}},
		"stops below leave":               {{1, true}, {0.49, false}, {0.6, false}},
		"yields again after a stop":       {{1, true}, {0, false}, {0.9, true}},
		"just under enter never yields":   {{0.899, false}, {0.899, false}, {0.899, false}},
		"a paused (zero) window releases": {{1, true}, {1, true}, {0, false}},
	} {
		t.Run(name, func(t *testing.T) {
			var s yieldState
			for i, st := range steps {
				if got := s.next(st.share); got != st.want {
					t.Fatalf("window %d (share %.3f): yield = %v, want %v", i, st.share, got, st.want)
				}
			}
		})
	}
}

func TestReleaseAtLeast(t *testing.T) {
	for _, c := range []struct {
		rel          string
		major, minor int
		want         bool
	}{
		{"6.18.44-fc-v669", 5, 15, true},
		{"5.15.0-91-generic", 5, 15, true},
		{"5.14.21-150500", 5, 15, false},
		{"5.4.0", 5, 15, false},
		{"4.19.0", 5, 15, false},
		{"10.0", 5, 15, true},
		{"", 5, 15, false},
	} {
		if got := releaseAtLeast(c.rel, c.major, c.minor); got != c.want {
			t.Errorf("releaseAtLeast(%q, %d, %d) = %v, want %v", c.rel, c.major, c.minor, got, c.want)
		}
	}
}

// TestCPUYield runs a busy loop in one of two sandboxes: only the busy one
// is made SCHED_IDLE, and the parent yields to the host while it is; both
// are released when the loop is paused and when it ends.
func TestCPUYield(t *testing.T) {
	testutil.Short(t)
	testutil.Requires(t, kernelAtLeast(5, 15), "the kernel has no cgroup cpu.idle (5.15 or later needed)")
	f := fixture(t)
	const parent = testCgroupParent + "-yield"
	b, err := New(Config{CgroupParent: parent, CPUYield: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", parent))
		dirs = append(dirs, filepath.Join(cgroupRoot, parent))
		for _, d := range dirs {
			os.Remove(d)
		}
	})
	if !b.Capabilities().Has(runtime.CapCPUYield) {
		t.Fatalf("capabilities %v lack %s", b.Capabilities().Features, runtime.CapCPUYield)
	}
	hogSpec := runtimetest.NewSpec(t, runtimetest.NewID("hog"), f.Layer, f.RunnerDir)
	hog := runtimetest.Create(t, b, hogSpec)
	calm := runtimetest.Create(t, b, runtimetest.NewSpec(t, runtimetest.NewID("calm"), f.Layer, f.RunnerDir))
	idleOf := func(sb runtime.Sandbox) string {
		file, _ := sb.(*sandbox).cg.cpuFiles()
		if file == "" {
			t.Fatal("sandbox cgroup has no cpu.idle")
		}
		return file
	}
	parentIdle := filepath.Join(b.yield.parentDir, "cpu.idle")
	wait := func(what string, want map[string]bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ok := true
			for file, on := range want {
				if readFlag(file) != on {
					ok = false
				}
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				got := map[string]string{}
				for file := range want {
					v, _ := os.ReadFile(file)
					got[file] = strings.TrimSpace(string(v))
				}
				t.Fatalf("%s: cpu.idle files %v, want %v", what, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	runtimetest.MustExec(t, hogSpec.SocketPath, "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > /tmp/hog.pid")
	wait("busy loop running", map[string]bool{idleOf(hog): true, idleOf(calm): false, parentIdle: true})

	if err := hog.(runtime.Pauser).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait("busy sandbox paused", map[string]bool{idleOf(hog): false, parentIdle: false})
	if err := hog.(runtime.Pauser).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait("busy sandbox resumed", map[string]bool{idleOf(hog): true, idleOf(calm): false, parentIdle: true})

	runtimetest.MustExec(t, hogSpec.SocketPath, "kill $(cat /tmp/hog.pid)")
	wait("busy loop ended", map[string]bool{idleOf(hog): false, idleOf(calm): false, parentIdle: false})
}
