package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

// prespawnBackend returns a backend keeping one zygote for runnerDir, with
// its socket and log dirs on the filesystem of the test temp dirs.
func prespawnBackend(t testing.TB, runnerDir string) *Backend {
	t.Helper()
	return prespawnBackendIn(t, runnerDir, testCgroupParent, false)
}

// prespawnBackendIn is prespawnBackend with the cgroup parent given (owned
// by the backend when own).
func prespawnBackendIn(t testing.TB, runnerDir, parent string, own bool) *Backend {
	t.Helper()
	dir := runtimetest.TempDir(t)
	b, err := New(Config{
		CgroupParent: parent,
		OwnParent:    own,
		Logger:       testLogger(),
		Prespawn: &Prespawn{
			Size:      1,
			RunnerDir: runnerDir,
			UIDMap:    runtimetest.TestIDMap,
			GIDMap:    runtimetest.TestIDMap,
			SocketDir: filepath.Join(dir, "sock"),
			LogDir:    filepath.Join(dir, "log"),
			Keep:      testKeep(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing backend: %v", err)
		}
	})
	return b
}

// testKeep is Prespawn.Keep for the tests' specs: every path of theirs
// (layers, runner, upper, work and state dirs) is a test temp dir.
func testKeep() []string { return []string{filepath.Clean(os.TempDir())} }

// waitZygote waits until the pool has a zygote ready and returns its pid.
func waitZygote(t testing.TB, b *Backend) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b.pool.mu.Lock()
		if n := len(b.pool.ready); n > 0 {
			pid := b.pool.ready[n-1].g.pid
			b.pool.mu.Unlock()
			return pid
		}
		b.pool.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no zygote became ready")
	return 0
}

// TestConformancePrespawn runs the whole conformance suite with zygotes.
func TestConformancePrespawn(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	f.NewBackend = func(t *testing.T) runtime.Backend { return prespawnBackend(t, f.RunnerDir) }
	runtimetest.Run(t, f)
}

// TestPrespawnUsesZygote checks that Create hands its config to the waiting
// zygote (same pid becomes the guest), that the sandbox is fully set up and
// confined like a cold one, and that the pool refills. On pure cgroup v2
// no zygotes are kept: the same backend starts the guest cold, born in its
// sandbox's cgroup (CLONE_INTO_CGROUP; Create moves no process there).
func TestPrespawnUsesZygote(t *testing.T) {
	testutil.RequiresRoot(t)
	f := fixture(t)
	b := prespawnBackend(t, f.RunnerDir)
	v2 := b.mode == "v2"
	zpid := 0
	if v2 {
		if b.pool != nil {
			t.Fatal("a zygote pool on cgroup v2")
		}
	} else {
		zpid = waitZygote(t, b)
	}

	spec := runtimetest.NewSpec(t, runtimetest.NewID("zyg"), f.Layer, f.RunnerDir)
	sb := runtimetest.Create(t, b, spec)
	var st state
	if err := json.Unmarshal(sb.State(), &st); err != nil {
		t.Fatal(err)
	}
	if !v2 && st.Pid != zpid {
		t.Fatalf("guest pid %d, want the zygote %d", st.Pid, zpid)
	}
	out, _ := runtimetest.MustExec(t, sb.SocketPath(), "hostname; cat /proc/self/status | grep -E '^(Seccomp|NoNewPrivs|CapBnd):'")
	for _, want := range []string{spec.ID, "Seccomp:\t2", "NoNewPrivs:\t1", "CapBnd:\t00000000a00405fb"} {
		if !strings.Contains(out, want) {
			t.Errorf("sandbox output lacks %q:\n%s", want, out)
		}
	}
	cg, err := loadCgroup(b.mode, st.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cg.contains(st.Pid); err != nil || !ok {
		t.Errorf("guest %d not in its sandbox cgroup: %v %v", st.Pid, ok, err)
	}
	if _, err := os.Stat(filepath.Join(spec.StateDir, guestLogName)); err != nil {
		t.Errorf("guest log not moved into the state dir: %v", err)
	}
	if !v2 {
		if next := waitZygote(t, b); next == zpid {
			t.Fatal("pool did not refill")
		}
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertGone(t, f, sb, spec)
}

func testLogger() *slog.Logger {
	if os.Getenv("AGENTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

// TestNewRemovesPartialZygoteCgroups checks that a backend starting with a
// pool removes what an earlier daemon left of a zygote's cgroup in some
// hierarchies only (killed while it renamed a claimed zygote's cgroup, or
// deleted one, a hierarchy at a time), processes included.
func TestNewRemovesPartialZygoteCgroups(t *testing.T) {
	testutil.RequiresRoot(t)
	if cgroupMode() == "v2" {
		testutil.NotApplicable(t, "zygotes are kept on cgroup v1 hierarchies only")
	}
	roots := newBackendTB(t).hierarchyRoots()
	testutil.Requires(t, len(roots) >= 2, fmt.Sprintf("at least 2 cgroup v1 hierarchies (found %d)", len(roots)))
	// Only a backend owning its parent removes zygote cgroups there: on
	// a shared one they may be another live backend's.
	parent := ownedParent(t, "zyg")
	name := zygotePrefix + "left" + strconv.Itoa(os.Getpid())
	var dirs []string
	for _, root := range roots {
		if filepath.Base(root) == "freezer" {
			continue // gone already: renamed or deleted first
		}
		dir := filepath.Join(root, parent, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			_ = os.Remove(d)
			_ = os.Remove(filepath.Dir(d))
		}
	})
	sleep, exited := testutil.Sleeper(t)
	if err := os.WriteFile(filepath.Join(dirs[0], "cgroup.procs"), []byte(strconv.Itoa(sleep.Pid)), 0); err != nil {
		t.Fatal(err)
	}

	b := prespawnBackendIn(t, fixture(t).RunnerDir, parent, true)
	waitZygote(t, b) // its own zygote is not disturbed either
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("zygote cgroup dir %s left: %v", d, err)
		}
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("the process left in the zygote cgroup was not killed")
	}
}

// TestPoolCloseWaitsForSpawn closes the pool while a zygote is being
// started: when Close returns, that guest, its cgroup and its socket are
// gone (a daemon exiting right after used to leave the guest behind).
func TestPoolCloseWaitsForSpawn(t *testing.T) {
	testutil.RequiresRoot(t)
	runnerDir := fixture(t).RunnerDir
	spawned := make(chan int, 1)
	testHookSpawned = func(p *zygotePool, pid int) {
		select {
		case spawned <- pid:
		default:
			return
		}
		// Hold this spawn until the pool is closing.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				time.Sleep(50 * time.Millisecond) // let a Close that does not wait return
				return
			}
		}
	}
	t.Cleanup(func() { testHookSpawned = nil })
	parent := ownedParent(t, "close")
	dir := runtimetest.TempDir(t)
	b, err := New(Config{CgroupParent: parent, OwnParent: true, Logger: testLogger(), Prespawn: &Prespawn{
		Size: 1, RunnerDir: runnerDir, UIDMap: runtimetest.TestIDMap, GIDMap: runtimetest.TestIDMap,
		SocketDir: filepath.Join(dir, "sock"), LogDir: filepath.Join(dir, "log"), Keep: testKeep(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if cgroupMode() == "v2" {
		// Pure cgroup v2 keeps no zygotes (guests are born in their
		// cgroup): nothing may be started, so nothing can be left.
		if b.pool != nil {
			t.Error("a backend on pure cgroup v2 keeps a zygote pool")
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case pid := <-spawned:
			t.Errorf("zygote %d started on pure cgroup v2", pid)
		default:
		}
		if socks, _ := filepath.Glob(filepath.Join(dir, "sock", zygotePrefix+"*")); len(socks) > 0 {
			t.Errorf("zygote sockets left after Close: %v", socks)
		}
		return
	}
	var pid int
	select {
	case pid = <-spawned:
	case <-time.After(10 * time.Second):
		t.Fatal("no zygote was started")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("zygote %d being started when Close was called still exists after Close returned (kill 0: %v)", pid, err)
	}
	if left := b.childCgroups(zygotePrefix + "*"); len(left) > 0 {
		t.Errorf("zygote cgroups left under %s after Close: %v", parent, left)
	}
	if socks, _ := filepath.Glob(filepath.Join(dir, "sock", zygotePrefix+"*")); len(socks) > 0 {
		t.Errorf("zygote sockets left after Close: %v", socks)
	}
}

// A zygote keeps only Prespawn.Keep while it waits: a spec with any path
// elsewhere is not given one (it starts cold).
func TestPoolMatchesKeep(t *testing.T) {
	p := &zygotePool{cfg: Prespawn{RunnerDir: "/data/runner/x", UIDMap: runtimetest.TestIDMap, GIDMap: runtimetest.TestIDMap, Keep: []string{"/data"}}}
	spec := runtime.Spec{
		Layers: []string{"/data/layers/a"}, UpperDir: "/data/sb/1/upper", WorkDir: "/data/sb/1/work",
		RunnerDir: "/data/runner/x", StateDir: "/data/sb/1/state", UIDMap: runtimetest.TestIDMap, GIDMap: runtimetest.TestIDMap,
	}
	if !p.matches(spec) {
		t.Error("a spec inside Keep was refused")
	}
	for name, mod := range map[string]func(s *runtime.Spec){
		"layer":  func(s *runtime.Spec) { s.Layers = append(s.Layers, "/other/layer") },
		"upper":  func(s *runtime.Spec) { s.UpperDir = "/data2/upper" },
		"work":   func(s *runtime.Spec) { s.WorkDir = "/data/../etc/work" },
		"state":  func(s *runtime.Spec) { s.StateDir = "/tmp/state" },
		"runner": func(s *runtime.Spec) { s.RunnerDir = "/data/runner/y" },
		"ids":    func(s *runtime.Spec) { s.UIDMap.HostID++ },
	} {
		s := spec
		s.Layers = append([]string(nil), spec.Layers...)
		mod(&s)
		if p.matches(s) {
			t.Errorf("%s: a spec outside Keep (or another runner/id map) got a zygote", name)
		}
	}
}

// testRanges is a tiny allocator of ranges above TestIDMap (the layers').
type testRanges struct {
	mu   chan struct{}
	used map[runtime.IDMap]bool
}

func newTestRanges() *testRanges {
	return &testRanges{mu: make(chan struct{}, 1), used: map[runtime.IDMap]bool{}}
}

func (r *testRanges) Alloc() (runtime.IDMap, error) {
	r.mu <- struct{}{}
	defer func() { <-r.mu }()
	for i := uint32(1); i < 64; i++ {
		m := runtime.IDMap{HostID: runtimetest.TestIDMap.HostID + i*65536, Size: 65536}
		if !r.used[m] {
			r.used[m] = true
			return m, nil
		}
	}
	return runtime.IDMap{}, errors.New("exhausted")
}

func (r *testRanges) Release(m runtime.IDMap) {
	r.mu <- struct{}{}
	defer func() { <-r.mu }()
	delete(r.used, m)
}

func (r *testRanges) inUse() int {
	r.mu <- struct{}{}
	defer func() { <-r.mu }()
	return len(r.used)
}

// TestPrespawnRangesOfTheirOwn: with Prespawn.IDs every zygote runs in a
// range of its own; ClaimIDRange hands one's range to the caller and the
// Create with that range uses that very zygote (idmapped onto the layers'
// range); a zygote discarded unused frees its range, a claimed one does
// not (the claimer owns it).
func TestPrespawnRangesOfTheirOwn(t *testing.T) {
	f := fixture(t)
	ranges := newTestRanges()
	dir := runtimetest.TempDir(t)
	b, err := New(Config{
		CgroupParent: testCgroupParent,
		Logger:       testLogger(),
		Prespawn: &Prespawn{
			Size:      1,
			RunnerDir: f.RunnerDir,
			IDs:       ranges,
			LayerIDs:  runtimetest.TestIDMap,
			SocketDir: filepath.Join(dir, "sock"),
			LogDir:    filepath.Join(dir, "log"),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.pool == nil {
		// Pure cgroup v2 keeps no zygotes: nothing to claim, and no range
		// is taken.
		defer b.Close()
		if _, ok := b.ClaimIDRange(); ok || b.mode != "v2" || ranges.inUse() != 0 {
			t.Fatalf("no pool on a %s host, claim %v, %d ranges in use", b.mode, ok, ranges.inUse())
		}
		return
	}
	time.Sleep(50 * time.Millisecond)
	if n := ranges.inUse(); n != 0 {
		t.Fatalf("%d ranges taken before FillPool", n)
	}
	b.FillPool()
	pid := waitZygote(t, b)
	r, ok := b.ClaimIDRange()
	if !ok || r.HostID == runtimetest.TestIDMap.HostID || r.Size != 65536 {
		t.Fatalf("ClaimIDRange = %+v, %v", r, ok)
	}
	spec := runtimetest.NewSpec(t, "claimed", f.Layer, f.RunnerDir)
	spec.LayerIDs, spec.UIDMap, spec.GIDMap = runtimetest.TestIDMap, r, r
	ctx := context.Background()
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var st state
	if err := json.Unmarshal(sb.State(), &st); err != nil || st.Pid != pid {
		t.Fatalf("the claimed zygote (pid %d) was not used: state %s", pid, sb.State())
	}
	out, _ := runtimetest.MustExec(t, sb.SocketPath(), "cat /proc/self/uid_map; stat -c %u /bin/busybox")
	if f := strings.Fields(out); len(f) != 4 || f[1] != strconv.FormatUint(uint64(r.HostID), 10) || f[3] != "0" {
		t.Fatalf("inside the claimed sandbox: %q", out)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	// The refill is in a range of its own, which close frees; the claimed
	// range stays the claimer's.
	waitZygote(t, b)
	if n := ranges.inUse(); n != 2 {
		t.Fatalf("%d ranges in use with one claimed and one zygote waiting, want 2", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n := ranges.inUse(); n != 1 {
		t.Fatalf("%d ranges in use after close, want 1 (the claimed one)", n)
	}
}
