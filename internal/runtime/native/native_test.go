package native

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

const testCgroupParent = "agentbox-test"

func TestMain(m *testing.M) {
	code := m.Run()
	runtimetest.RemoveBuildCache()
	if layerDir != "" {
		os.RemoveAll(layerDir)
	}
	os.Exit(code)
}

var (
	layerOnce sync.Once
	layerDir  string
)

// fixture returns the conformance fixture; the busybox layer is shared by
// every test of the package (it is only ever a read-only lower dir).
func fixture(t *testing.T) runtimetest.Fixture {
	t.Helper()
	return runtimetest.Fixture{
		NewBackend: newTestBackend,
		Layer:      sharedLayer(t),
		RunnerDir:  runtimetest.RunnerDir(t),
		Limits:     readLimits,
		Leftovers:  leftovers,
	}
}

func sharedLayer(t testing.TB) string {
	t.Helper()
	testutil.RequiresRoot(t)
	layerOnce.Do(func() {
		d, err := os.MkdirTemp("", "agentbox-layer-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o755)
		layerDir = d
	})
	layer := filepath.Join(layerDir, "busybox")
	if _, err := os.Stat(layer); err != nil {
		src := runtimetest.BusyboxLayer(t, runtimetest.TestIDMap)
		// t.TempDir vanishes with t: move the tree to the shared dir.
		if err := os.Rename(src, layer); err != nil {
			t.Fatal(err)
		}
	}
	return layer
}

func newTestBackend(t *testing.T) runtime.Backend { return newBackendTB(t) }

func newBackendTB(t testing.TB) *Backend {
	b, err := New(Config{CgroupParent: testCgroupParent, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	testutil.Short(t)
	runtimetest.Run(t, fixture(t))
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Fields(string(b))[0]
	if s == "max" {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// readLimits reads the applied limits back from the cgroup files.
func readLimits(t *testing.T, sb runtime.Sandbox) runtime.Resources {
	s := sb.(*sandbox)
	var r runtime.Resources
	switch cg := s.cg.(type) {
	case *cgroupV1:
		quota := readInt(t, filepath.Join(cg.dir["cpu"], "cpu.cfs_quota_us"))
		period := readInt(t, filepath.Join(cg.dir["cpu"], "cpu.cfs_period_us"))
		r.CPUs = float64(quota) / float64(period)
		r.MemoryBytes = readInt(t, filepath.Join(cg.dir["memory"], "memory.limit_in_bytes"))
		if _, err := os.Stat(filepath.Join(cg.dir["memory"], "memory.memsw.limit_in_bytes")); err == nil {
			if sw := readInt(t, filepath.Join(cg.dir["memory"], "memory.memsw.limit_in_bytes")); sw != r.MemoryBytes {
				t.Errorf("memsw limit %d != memory limit %d: swap allowed", sw, r.MemoryBytes)
			}
		}
		r.PidsMax = readInt(t, filepath.Join(cg.dir["pids"], "pids.max"))
	case *cgroupV2:
		dir := cg.dirs()[0]
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		q, _ := strconv.ParseFloat(f[0], 64)
		p, _ := strconv.ParseFloat(f[1], 64)
		r.CPUs = q / p
		r.MemoryBytes = readInt(t, filepath.Join(dir, "memory.max"))
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			if sw := readInt(t, filepath.Join(dir, "memory.swap.max")); sw != 0 {
				t.Errorf("memory.swap.max = %d, want 0", sw)
			}
		}
		r.PidsMax = readInt(t, filepath.Join(dir, "pids.max"))
	}
	return r
}

// leftovers lists cgroup dirs of id in any hierarchy.
func leftovers(t *testing.T, id string) []string {
	var out []string
	matches, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", testCgroupParent, id))
	out = append(out, matches...)
	if _, err := os.Stat(filepath.Join(cgroupRoot, testCgroupParent, id)); err == nil {
		out = append(out, filepath.Join(cgroupRoot, testCgroupParent, id))
	}
	return out
}

func TestCapabilities(t *testing.T) {
	b, err := New(Config{})
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	c := b.Capabilities()
	for _, f := range []string{runtime.CapUserNamespaces, runtime.CapCgroups, runtime.CapSeccomp, runtime.CapNetworkNone, runtime.CapPause, runtime.CapStats} {
		if !c.Has(f) {
			t.Errorf("missing capability %s", f)
		}
	}
	if c.Name != Name || c.CgroupMode == "" {
		t.Errorf("capabilities = %+v", c)
	}
	if _, err := New(Config{CgroupParent: "../escape"}); err == nil {
		t.Error("New accepted cgroup parent ../escape")
	}
}

func TestProcStartTime(t *testing.T) {
	a, err := procStartTime(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("procStartTime(self) = %d, %v", a, err)
	}
	if _, err := procStartTime(1 << 30); err == nil {
		t.Error("procStartTime of a missing pid succeeded")
	}
}
