package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

const testCgroupParent = "agentbox-gvisor-test"

var (
	rootOnce sync.Once
	rootDir  string // the backends' Root, shared by every test
)

func TestMain(m *testing.M) {
	code := m.Run()
	runtimetest.RemoveBuildCache()
	if rootDir != "" {
		// runsc's empty network namespace for gofers, bind-mounted in
		// its root once per root.
		_ = unix.Unmount(filepath.Join(rootDir, "runsc", "null-netns"), unix.MNT_DETACH)
	}
	if rootDir != "" {
		os.RemoveAll(rootDir)
	}
	os.Exit(code)
}

// requiresRunsc gates t on root and an installed runsc (CI installs it
// with scripts/install-deps.sh).
func requiresRunsc(t testing.TB) {
	t.Helper()
	testutil.RequiresRoot(t)
	_, err := FindRunsc("")
	testutil.Requires(t, err == nil, "gVisor's runsc (scripts/install-deps.sh builds it into "+CachedPath()+")")
}

// testRoot is the backends' Root: 0711, as the gofer must traverse it.
func testRoot(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		d, err := os.MkdirTemp("", "agentbox-gvisor-")
		if err != nil {
			t.Fatal(err)
		}
		rootDir = d
	})
	return rootDir
}

func newBackendTB(t testing.TB) *Backend {
	t.Helper()
	b, err := New(Config{Root: testRoot(t), CgroupParent: testCgroupParent, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func fixture(t *testing.T) runtimetest.Fixture {
	t.Helper()
	requiresRunsc(t)
	return runtimetest.Fixture{
		NewBackend: func(t *testing.T) runtime.Backend { return newBackendTB(t) },
		Layer:      runtimetest.SharedLayer(t),
		RunnerDir:  runtimetest.RunnerDir(t),
		Limits:     readLimits,
		Leftovers:  leftovers,
	}
}

func TestConformance(t *testing.T) {
	testutil.Short(t)
	runtimetest.Run(t, fixture(t))
}

// readLimits reads the limits runsc applied back from the host cgroup.
func readLimits(t *testing.T, sb runtime.Sandbox) runtime.Resources {
	s := sb.(*sandbox)
	rel := s.st.Cgroup
	var r runtime.Resources
	if s.b.mode == "v2" {
		dir := filepath.Join(cgroupRoot, rel)
		r.CPUs = runtimetest.CPUMax(t, dir)
		r.MemoryBytes = runtimetest.CgroupInt(t, filepath.Join(dir, "memory.max"))
		r.PidsMax = sentryPidsLimit(t, s)
		if host := runtimetest.CgroupInt(t, filepath.Join(dir, "pids.max")); host != hostPidsLimit(r.PidsMax) {
			t.Errorf("host pids.max = %d, want the backstop %d", host, hostPidsLimit(r.PidsMax))
		}
		return r
	}
	r.PidsMax = sentryPidsLimit(t, s)
	r.CPUs = runtimetest.CFSQuota(t, filepath.Join(cgroupRoot, "cpu", rel))
	r.MemoryBytes = runtimetest.CgroupInt(t, filepath.Join(cgroupRoot, "memory", rel, "memory.limit_in_bytes"))
	if host := runtimetest.CgroupInt(t, filepath.Join(cgroupRoot, "pids", rel, "pids.max")); host != hostPidsLimit(r.PidsMax) {
		t.Errorf("host pids.max = %d, want the backstop %d", host, hostPidsLimit(r.PidsMax))
	}
	return r
}

// sentryPidsLimit reads the pids limit the sentry enforces on the
// sandbox's processes (RLIMIT_NPROC), from inside.
func sentryPidsLimit(t *testing.T, s *sandbox) int64 {
	t.Helper()
	out, code, err := runtimetest.Exec(s.spec.SocketPath, "grep 'Max processes' /proc/self/limits", 10*time.Second)
	if err != nil {
		t.Fatalf("exec in the sandbox: %v%s", err, logTail(s.spec))
	}
	f := strings.Fields(out)
	if code != 0 || len(f) < 4 {
		t.Fatalf("/proc/self/limits: %q, %d", out, code)
	}
	if f[2] == "unlimited" {
		return 0
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		t.Fatalf("Max processes %q", f[2])
	}
	return n
}

// leftovers lists what of sandbox id is still on the host: cgroup dirs in
// any hierarchy, its bundle, runsc's state of it.
func leftovers(t *testing.T, id string) []string {
	out := runtimetest.CgroupLeftovers(cgroupRoot, testCgroupParent, id)
	out = append(out, runtimetest.Existing(filepath.Join(rootDir, "b", id))...)
	states, _ := filepath.Glob(filepath.Join(rootDir, "runsc", id+"*"))
	return append(out, states...)
}

func TestCapabilities(t *testing.T) {
	requiresRunsc(t)
	b := newBackendTB(t)
	c := b.Capabilities()
	for _, f := range []string{runtime.CapOwnKernel, runtime.CapIsolation, runtime.CapCgroups, runtime.CapNetworkNone, runtime.CapPause, runtime.CapStats} {
		if !c.Has(f) {
			t.Errorf("missing capability %s", f)
		}
	}
	for _, f := range []string{runtime.CapSeccomp, runtime.CapUserNamespaces} {
		if c.Has(f) {
			t.Errorf("declares %s, which says nothing of a gVisor sandbox's processes", f)
		}
	}
	if c.Name != Name || c.CgroupMode == "" {
		t.Errorf("capabilities = %+v", c)
	}
	d := b.Describe()
	if d["version"] != PinnedVersion && os.Getenv("AGENTBOX_TEST_STRICT") == "1" {
		t.Errorf("runsc version = %q, want the pinned %s", d["version"], PinnedVersion)
	}
	if d["platform"] == "" {
		t.Errorf("Describe = %v: no platform", d)
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	for name, cfg := range map[string]Config{
		"relative root":  {Root: "rel"},
		"escaping group": {Root: "/tmp/x", CgroupParent: "../escape"},
		"platform":       {Root: "/tmp/x", Platform: "vm"},
		"missing runsc":  {Root: "/tmp/x", Runsc: "/nonexistent/runsc"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// TestSweepOrphans: a sandbox no record claims (a daemon died before it
// recorded it) is removed by the sweep, its host resources with it; one
// the daemon keeps is untouched.
func TestSweepOrphans(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newBackendTB(t)
	kept := runtimetest.NewSpec(t, runtimetest.NewID("keep"), f.Layer, f.RunnerDir)
	orphan := runtimetest.NewSpec(t, runtimetest.NewID("orph"), f.Layer, f.RunnerDir)
	runtimetest.Create(t, b, kept)
	sb, err := b.Create(t.Context(), orphan)
	if err != nil {
		t.Fatal(err)
	}
	swept, err := newBackendTB(t).SweepOrphans(t.Context(), func(id string) bool { return id != orphan.ID })
	if err != nil || len(swept) != 1 || swept[0] != orphan.ID {
		t.Fatalf("SweepOrphans = %v, %v; want [%s]", swept, err, orphan.ID)
	}
	select {
	case <-sb.Wait():
	case <-time.After(10 * time.Second):
		t.Fatal("the orphan's sandbox process outlived the sweep")
	}
	if l := leftovers(t, orphan.ID); len(l) > 0 {
		t.Errorf("left of the orphan: %v", l)
	}
	if out, code := runtimetest.MustExec(t, kept.SocketPath, "echo kept"); code != 0 || out != "kept\n" {
		t.Errorf("the kept sandbox after the sweep: %q, %d", out, code)
	}
	_ = os.RemoveAll(orphan.StateDir) // the daemon's, with its record
}
