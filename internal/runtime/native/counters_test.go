package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Both layouts parse into the same Stats, in nanoseconds of CPU.
func TestCountersFormats(t *testing.T) {
	v1 := t.TempDir()
	writeFiles(t, v1, map[string]string{
		"cpuacct.usage":         "1500000000\n",
		"memory.usage_in_bytes": "4096\n",
		"pids.current":          "3\n",
		"memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
	})
	v2 := t.TempDir()
	writeFiles(t, v2, map[string]string{
		"cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"memory.current": "4096\n",
		"pids.current":   "3\n",
		"memory.events":  "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n",
	})
	want := runtime.Stats{CPUTime: 1500 * time.Millisecond, MemoryBytes: 4096, Pids: 3, OOMKills: 2}
	for name, c := range map[string]*counters{"v1": v1Counters(v1, v1, v1), "v2": v2Counters(v2)} {
		got, err := c.stats()
		if err != nil || got != want {
			t.Errorf("%s: stats = %+v, %v; want %+v", name, got, err, want)
		}
		c.close()
	}
}

// Kept descriptors read the current content every time; a missing memory
// or pids controller reads as zero; a missing cpuacct is an error; a
// kernel without oom_kill reads as zero.
func TestCountersFreshAndPartial(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"cpuacct.usage": "10\n", "memory.oom_control": "oom_kill_disable 0\n"})
	c := v1Counters(dir, dir, "")
	defer c.close()
	if s, err := c.stats(); err != nil || s != (runtime.Stats{CPUTime: 10}) {
		t.Fatalf("stats = %+v, %v", s, err)
	}
	writeFiles(t, dir, map[string]string{"cpuacct.usage": "20\n"})
	if s, err := c.stats(); err != nil || s.CPUTime != 20 {
		t.Fatalf("after a change: stats = %+v, %v; want CPUTime 20", s, err)
	}
	if _, err := v1Counters("", dir, dir).stats(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("without cpuacct: err = %v, want ErrNotExist", err)
	}
	bad := t.TempDir()
	writeFiles(t, bad, map[string]string{"cpuacct.usage": "x\n"})
	if _, err := v1Counters(bad, "", "").stats(); err == nil {
		t.Fatal("a malformed counter parsed")
	}
}

// close may run while reads are in flight: they fail with ErrClosed or
// succeed, never read another file.
func TestCountersCloseConcurrent(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"cpu.stat": "usage_usec 7\n"})
	c := v2Counters(dir)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				s, err := c.stats()
				if err == nil && s.CPUTime != 7000 {
					t.Errorf("read %+v", s)
					return
				}
				if err != nil && !errors.Is(err, os.ErrClosed) {
					t.Errorf("read error %v", err)
					return
				}
			}
		}()
	}
	time.Sleep(time.Millisecond)
	c.close()
	wg.Wait()
	if _, err := c.stats(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// On a real cgroup the kept descriptors follow the counters (pids.current
// moves with a process joining and leaving), and a read after the cgroup
// is deleted fails instead of returning stale numbers.
func TestCountersRealCgroup(t *testing.T) {
	testutil.RequiresRoot(t)
	mode := cgroupMode()
	testutil.Requires(t, mode != "", "a cgroup hierarchy")
	path := "/agentbox-test-counters-" + filepath.Base(t.TempDir())
	cg, err := newCgroup(mode, path, runtime.Resources{PidsMax: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.delete()
	before, err := cg.stats()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := cg.addProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	during, err := cg.stats()
	if err != nil {
		t.Fatal(err)
	}
	if during.Pids != before.Pids+1 {
		t.Fatalf("pids.current %d with a process in, %d before", during.Pids, before.Pids)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		after, err := cg.stats()
		if err != nil {
			t.Fatal(err)
		}
		if after.Pids == before.Pids {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids.current stays %d after the process left", after.Pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cg.delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := cg.stats(); err == nil {
		t.Fatal("stats of a deleted cgroup succeeded")
	}
}

// delete removes the cgroup from every hierarchy, with one rmdir each
// normally and through the library when a hierarchy has a sub-cgroup.
func TestCgroupDelete(t *testing.T) {
	testutil.RequiresRoot(t)
	mode := cgroupMode()
	testutil.Requires(t, mode != "", "a cgroup hierarchy")
	for _, sub := range []bool{false, true} {
		path := fmt.Sprintf("/agentbox-test-delete-%s-%v", filepath.Base(t.TempDir()), sub)
		cg, err := newCgroup(mode, path, runtime.Resources{PidsMax: 10, MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		dirs := cg.dirs()
		if sub {
			if err := os.Mkdir(filepath.Join(dirs[0], "child"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := cg.delete(); err != nil {
			t.Fatalf("sub-cgroup %v: delete: %v", sub, err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("sub-cgroup %v: %s left (%v)", sub, d, err)
			}
		}
	}
}
