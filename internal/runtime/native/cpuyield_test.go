package native

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestYieldStateNext(t *testing.T) {
	type step struct {
		share    float64
		runnable bool
		want     bool
	}
	for name, steps := range map[string][]step{
		"a busy window yields":          {{0.95, false, true}},
		"idle stays":                    {{0, false, false}, {0.3, true, false}, {0.89, true, false}},
		"stays yielding above leave":    {{1, false, true}, {0.6, false, true}, {0.5, false, true}, {0.95, false, true}},
		"stops after two quiet windows": {{1, false, true}, {0.49, false, true}, {0.1, false, false}, {0.6, false, false}},
		"a busy window resets quiet":    {{1, false, true}, {0.2, false, true}, {0.7, false, true}, {0.2, false, true}, {0, false, false}},
		"runnable at the end is busy":   {{1, false, true}, {0, true, true}, {0, true, true}, {0, false, true}, {0, false, false}},
		"starved: waits come in lumps":  {{1, false, true}, {0, true, true}, {2.2, true, true}, {0.3, true, true}, {0, true, true}},
		"yields again after a stop":     {{1, false, true}, {0, false, true}, {0, false, false}, {0.9, false, true}},
		"just under enter never yields": {{0.899, true, false}, {0.899, true, false}, {0.899, true, false}},
	} {
		t.Run(name, func(t *testing.T) {
			var s yieldState
			for i, st := range steps {
				if got := s.next(st.share, st.runnable); got != st.want {
					t.Fatalf("window %d (share %.3f, runnable %v): yield = %v, want %v", i, st.share, st.runnable, got, st.want)
				}
			}
		})
	}
}

func TestTaskRunnable(t *testing.T) {
	// The calling thread is running while it reads its own state; locked,
	// so the goroutine cannot move to another (sleeping) thread between
	// Gettid and the read.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if !taskRunnable(unix.Gettid()) {
		t.Error("the running thread is not runnable")
	}
	if taskRunnable(1 << 30) {
		t.Error("a missing task is runnable")
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
	// A parent left yielding by a daemon that died is released.
	parentDir, err := cpuParentDir(cgroupMode(), parent)
	if err != nil || parentDir == "" {
		t.Fatalf("cpu hierarchy dir of %s: %q, %v", parent, parentDir, err)
	}
	// A child with a CPU limit makes the parent a cpu cgroup on v2 too
	// (its cpu.idle appears once the controller is enabled above it).
	probe, err := newCgroup(cgroupMode(), "/"+parent+"/"+runtimetest.NewID("probe"), runtime.Resources{CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := probe.delete(); err != nil {
		t.Fatal(err)
	}
	if err := writeFlag(filepath.Join(parentDir, "cpu.idle"), true); err != nil {
		t.Fatal(err)
	}
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

	parentIdle := filepath.Join(parentDir, "cpu.idle")
	wait("stale parent", map[string]bool{parentIdle: false})

	runtimetest.MustExec(t, hogSpec.SocketPath, "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > /tmp/hog.pid")
	wait("busy loop running", map[string]bool{idleOf(hog): true, idleOf(calm): false, parentIdle: true})

	// A host that wants all the CPU is not yielded to: the parent stops
	// yielding while the busy sandbox, starved, keeps yielding to its
	// neighbours (its waits are accounted in lumps; it is still
	// CPU-bound).
	var stop atomic.Bool
	var spinners sync.WaitGroup
	for range goruntime.NumCPU() {
		spinners.Add(1)
		go func() {
			defer spinners.Done()
			for !stop.Load() { // a busy loop of the host's
			}
		}()
	}
	released, parentReleased := false, false
	for end := time.Now().Add(10 * yieldWindow); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		released = released || !readFlag(idleOf(hog))
		parentReleased = parentReleased || !readFlag(parentIdle)
	}
	stop.Store(true)
	spinners.Wait()
	if released {
		t.Error("the busy sandbox stopped yielding while the host starved it")
	}
	if !parentReleased {
		t.Error("the sandboxes' parent kept yielding to a host that used every CPU")
	}
	wait("host quiet again", map[string]bool{idleOf(hog): true, idleOf(calm): false, parentIdle: true})

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

	// Closing the backend (a daemon stopping) releases what it made yield.
	runtimetest.MustExec(t, hogSpec.SocketPath, "sh -c 'while :; do :; done' >/dev/null 2>&1 &")
	wait("busy loop restarted", map[string]bool{idleOf(hog): true, parentIdle: true})
	b.Close()
	for _, file := range []string{idleOf(hog), parentIdle} {
		if readFlag(file) {
			t.Errorf("%s still 1 after Close", file)
		}
	}
}

func TestProcStatBusy(t *testing.T) {
	a, err := procStatBusy()
	if err != nil || a <= 0 {
		t.Fatalf("procStatBusy = %d, %v", a, err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); { // a little busy time
	}
	b, err := procStatBusy()
	if err != nil || b < a {
		t.Fatalf("procStatBusy went from %d to %d (%v)", a, b, err)
	}
}

func TestStatFiles(t *testing.T) {
	fds := func() int {
		e, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(e)
	}
	before := fds()
	f := statFiles{}
	tid := unix.Gettid()
	a, ok := f.read(tid, true)
	if !ok || a == 0 {
		t.Fatalf("read(self) = %d, %v", a, ok)
	}
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); { // some run time
	}
	b, ok := f.read(tid, true)
	if !ok || b <= a || len(f) != 1 {
		t.Fatalf("second read through the kept file = %d (first %d), %v, %d files", b, a, ok, len(f))
	}
	if _, ok := f.read(1<<30, true); ok || len(f) != 1 {
		t.Fatalf("a missing task read ok, or kept a file (%d)", len(f))
	}
	if _, ok := f.read(os.Getpid(), false); !ok || len(f) != 1 {
		t.Fatalf("a one-shot read failed or kept its file (%d)", len(f))
	}
	f.keep(map[int]uint64{})
	if len(f) != 0 || fds() != before {
		t.Fatalf("keep(none) left %d files, %d descriptors more", len(f), fds()-before)
	}
	f.read(tid, true)
	f.closeAll()
	if len(f) != 0 || fds() != before {
		t.Fatalf("closeAll left %d files, %d descriptors more", len(f), fds()-before)
	}
}
