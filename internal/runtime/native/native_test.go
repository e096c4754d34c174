package native

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

const testCgroupParent = "agentbox-test"

func TestMain(m *testing.M) {
	code := m.Run()
	runtimetest.RemoveBuildCache()
	os.Exit(code)
}

// fixture returns the conformance fixture; the busybox layer is shared by
// every test of the package (it is only ever a read-only lower dir).
func fixture(t *testing.T) runtimetest.Fixture {
	t.Helper()
	return runtimetest.Fixture{
		NewBackend: newTestBackend,
		Layer:      runtimetest.SharedLayer(t),
		RunnerDir:  runtimetest.RunnerDir(t),
		Limits:     readLimits,
		Leftovers:  leftovers,
	}
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

// TestConformanceStagedOverlay runs the suite with the root filesystem
// built as on kernels before 6.8 (layers staged in a private mount
// namespace and mounted with mount(2)), which this host's kernel would
// otherwise not take; CI's VM kernel takes only that path.
func TestConformanceStagedOverlay(t *testing.T) {
	testutil.Short(t)
	forceStagedOverlay = true
	t.Cleanup(func() { forceStagedOverlay = false })
	runtimetest.Run(t, fixture(t))
}

// TestConformanceForker runs the suite with guests started through a
// forker helper (the test guest run with ForkerArgs), as the daemon does.
func TestConformanceForker(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	f.NewBackend = func(t *testing.T) runtime.Backend {
		b, err := New(Config{CgroupParent: testCgroupParent, Logger: slog.New(slog.DiscardHandler), Forker: filepath.Join(f.RunnerDir, "agentbox")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	runtimetest.Run(t, f)
}

// readLimits reads the applied limits back from the cgroup files.
func readLimits(t *testing.T, sb runtime.Sandbox) runtime.Resources {
	s := sb.(*sandbox)
	var r runtime.Resources
	switch cg := s.cg.(type) {
	case *cgroupV1:
		r.CPUs = runtimetest.CFSQuota(t, cg.dir["cpu"])
		r.MemoryBytes = runtimetest.CgroupInt(t, filepath.Join(cg.dir["memory"], "memory.limit_in_bytes"))
		if _, err := os.Stat(filepath.Join(cg.dir["memory"], "memory.memsw.limit_in_bytes")); err == nil {
			if sw := runtimetest.CgroupInt(t, filepath.Join(cg.dir["memory"], "memory.memsw.limit_in_bytes")); sw != r.MemoryBytes {
				t.Errorf("memsw limit %d != memory limit %d: swap allowed", sw, r.MemoryBytes)
			}
		}
		r.PidsMax = runtimetest.CgroupInt(t, filepath.Join(cg.dir["pids"], "pids.max"))
	case *cgroupV2:
		dir := cg.dirs()[0]
		r.CPUs = runtimetest.CPUMax(t, dir)
		r.MemoryBytes = runtimetest.CgroupInt(t, filepath.Join(dir, "memory.max"))
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			if sw := runtimetest.CgroupInt(t, filepath.Join(dir, "memory.swap.max")); sw != 0 {
				t.Errorf("memory.swap.max = %d, want 0", sw)
			}
		}
		r.PidsMax = runtimetest.CgroupInt(t, filepath.Join(dir, "pids.max"))
	}
	return r
}

// leftovers lists cgroup dirs of id in any hierarchy.
func leftovers(t *testing.T, id string) []string {
	return runtimetest.CgroupLeftovers(cgroupRoot, testCgroupParent, id)
}

func TestCapabilities(t *testing.T) {
	b, err := New(Config{})
	testutil.Requires(t, err == nil, fmt.Sprintf("a native backend (cgroups): %v", err))
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

// TestForkerStartsGuests: with Config.Forker, guests (cold and prespawned)
// are the helper's children, not this process's, and a helper killed
// under the backend is replaced at the next create.
func TestForkerStartsGuests(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	forkerPath := filepath.Join(f.RunnerDir, "agentbox")
	parentOf := func(t *testing.T, pid int) (ppid int, cmdline string) {
		t.Helper()
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
		return ppid, strings.Join(strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00"), " ")
	}
	// create makes a sandbox on b and returns its guest's parent, having
	// checked that it is a forker and that the guest serves.
	create := func(t *testing.T, b *Backend, name string) int {
		t.Helper()
		sb := runtimetest.Create(t, b, runtimetest.NewSpec(t, runtimetest.NewID(name), f.Layer, f.RunnerDir))
		pid := sb.(*sandbox).st.Pid
		ppid, cmdline := parentOf(t, pid)
		if ppid == os.Getpid() || !strings.HasSuffix(cmdline, "agentbox "+strings.Join(ForkerArgs, " ")) {
			t.Fatalf("%s guest %d: parent %d %q; want the forker", name, pid, ppid, cmdline)
		}
		if out, code := runtimetest.MustExec(t, sb.SocketPath(), "echo ok"); code != 0 || strings.TrimSpace(out) != "ok" {
			t.Fatalf("%s guest: exec = %q, %d", name, out, code)
		}
		return ppid
	}

	t.Run("Cold", func(t *testing.T) {
		b, err := New(Config{CgroupParent: testCgroupParent, Logger: testLogger(), Forker: forkerPath})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		helper := create(t, b, "cold")
		if err := unix.Kill(helper, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if again := create(t, b, "again"); again == helper {
			t.Fatalf("guest still from the killed helper %d", helper)
		}
	})
	t.Run("Prespawned", func(t *testing.T) {
		dir := runtimetest.TempDir(t)
		b, err := New(Config{
			CgroupParent: testCgroupParent,
			Logger:       testLogger(),
			Forker:       forkerPath,
			Prespawn: &Prespawn{
				Size: 1, RunnerDir: f.RunnerDir, UIDMap: runtimetest.TestIDMap, GIDMap: runtimetest.TestIDMap,
				SocketDir: filepath.Join(dir, "sock"), LogDir: filepath.Join(dir, "log"), Keep: testKeep(),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		if b.mode == "v2" {
			// No zygotes there (guests are born in their cgroup): the
			// create is served cold, still by the forker.
			if b.pool != nil {
				t.Fatal("a zygote pool on cgroup v2")
			}
			create(t, b, "v2")
			return
		}
		if b.pool == nil {
			t.Fatalf("no zygote pool on a %s host", b.mode)
		}
		zpid := waitZygote(t, b)
		sb := runtimetest.Create(t, b, runtimetest.NewSpec(t, runtimetest.NewID("zyg"), f.Layer, f.RunnerDir))
		if pid := sb.(*sandbox).st.Pid; pid != zpid {
			t.Fatalf("guest %d is not the zygote %d", pid, zpid)
		}
		if ppid, cmdline := parentOf(t, zpid); !strings.HasSuffix(cmdline, "agentbox "+strings.Join(ForkerArgs, " ")) {
			t.Fatalf("zygote %d: parent %d %q; want the forker", zpid, ppid, cmdline)
		}
	})
}
