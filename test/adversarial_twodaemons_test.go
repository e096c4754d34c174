package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"

	"github.com/agentbox/agentbox/internal/testutil"
)

// Finding 9 of issue 11: two daemons on one host must not disturb each
// other. These tests run two daemons (own data dirs, own sockets) side by
// side and attack from where the neighbour stands: its start-up, its
// sweep, its shutdown, and the mounts it makes on the host.

// sandboxCgroup returns the cgroup path (freezer hierarchy on v1, the
// unified one on v2) of the processes of the sandbox id, found from the
// host's /proc, or "" when no process of it runs.
func sandboxCgroup(id string) string {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if p := procCgroup(e.Name()); strings.HasSuffix(p, "/"+id) {
			return p
		}
	}
	return ""
}

// zygotePids returns the daemon's waiting prespawned guests: the processes
// whose output goes to a log in its zygote log dir (a claimed zygote's log
// is renamed into its sandbox's dir). Each is given with its start time.
func zygotePids(d *daemon) map[int]string {
	dir := filepath.Join(d.dataDir, "sandboxes", ".zygotes") + "/"
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", "1"))
		if err != nil || !strings.HasPrefix(target, dir) {
			continue
		}
		out[pid] = procStart(pid)
	}
	return out
}

// procStart is field 22 of /proc/<pid>/stat (start time), "" when pid is
// gone or a zombie.
func procStart(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// waitZygotes waits until the daemon has n waiting zygotes.
func waitZygotes(t *testing.T, d *daemon, n int) map[int]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		z := zygotePids(d)
		if len(z) >= n {
			// Ready only once it reported it waits: give the last one
			// a moment past its fork.
			time.Sleep(200 * time.Millisecond)
			return zygotePids(d)
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon has %d zygotes, want %d", len(z), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkAlive fails t for every process of procs (pid -> start time) that
// is gone or was replaced.
func checkAlive(t *testing.T, what string, procs map[int]string) {
	t.Helper()
	for pid, start := range procs {
		if now := procStart(pid); now != start {
			t.Errorf("%s: process %d is gone (start time %q, was %q)", what, pid, now, start)
		}
	}
}

// TestAdversarialTwoDaemonsCgroupParents: two daemons with different data
// dirs put their sandboxes under different cgroup parents, none of them
// the shared legacy "/agentbox".
func TestAdversarialTwoDaemonsCgroupParents(t *testing.T) {
	a, b := newDaemon(t), newDaemon(t)
	sa, sb := a.create(t, agentbox.SandboxSpec{}), b.create(t, agentbox.SandboxSpec{})
	ca, cb := sandboxCgroup(sa.ID()), sandboxCgroup(sb.ID())
	if ca == "" || cb == "" {
		t.Fatalf("sandbox cgroups not found: %q, %q", ca, cb)
	}
	pa, pb := filepath.Dir(ca), filepath.Dir(cb)
	t.Logf("daemon A's sandbox in %s, daemon B's in %s", ca, cb)
	if pa == pb {
		t.Errorf("two daemons with different data dirs share the cgroup parent %s", pa)
	}
	for _, p := range []string{pa, pb} {
		if p == "/agentbox" {
			t.Errorf("a daemon put its sandbox under the shared legacy parent %s", p)
		}
	}
}

// TestAdversarialTwoDaemonsNeighbourStartStop: a second daemon starting
// (which sweeps leftovers of "its" earlier run) and stopping (which
// discards its prespawned guests) leaves the first daemon's zygotes,
// sandboxes, cgroups and sockets alone.
func TestAdversarialTwoDaemonsNeighbourStartStop(t *testing.T) {
	a := newDaemon(t)
	sa := a.create(t, agentbox.SandboxSpec{})
	mustRun(t, sa, "echo hello > /tmp/f")
	zygotes := waitZygotes(t, a, 2)
	cg := sandboxCgroup(sa.ID())
	sockets, _ := filepath.Glob(filepath.Join(filepath.Dir(a.socket), "sb", "*"))
	if cg == "" || len(sockets) == 0 {
		t.Fatalf("daemon A: sandbox cgroup %q, sockets %v", cg, sockets)
	}

	// The neighbour starts (sweeping at start-up), fills its pool, works,
	// and stops.
	b := newDaemon(t)
	waitZygotes(t, b, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := b.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "true")
	checkAlive(t, "daemon A's zygote after daemon B started", zygotes)
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	b.stop(syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond) // B's zygotes are discarded by now
	checkAlive(t, "daemon A's zygote after daemon B stopped", zygotes)

	if got := sandboxCgroup(sa.ID()); got != cg {
		t.Errorf("daemon A's sandbox cgroup %q, was %q", got, cg)
	}
	for _, s := range sockets {
		if _, err := os.Lstat(s); err != nil {
			t.Errorf("daemon A's socket %s: %v", s, err)
		}
	}
	if out := mustRun(t, sa, "cat /tmp/f"); out != "hello\n" {
		t.Errorf("daemon A's sandbox lost its file: %q", out)
	}
	// A's pool still serves creates.
	sa2 := a.create(t, agentbox.SandboxSpec{})
	mustRun(t, sa2, "true")
}

// TestAdversarialTwoDaemonsOneDataDir: a second daemon on a data dir in
// use is refused, and the first one is unharmed.
func TestAdversarialTwoDaemonsOneDataDir(t *testing.T) {
	a := newDaemon(t)
	sa := a.create(t, agentbox.SandboxSpec{})
	zygotes := waitZygotes(t, a, 2)
	sock := filepath.Join(a.dir, "second", "agentbox.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentboxBin(t), "serve", "--data-dir", a.dataDir, "--socket", sock)
	cmd.Env = append(os.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(a.dir, "secrets.key"))
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a second daemon on data dir %s was not refused (err %v):\n%s", a.dataDir, err, out)
	}
	t.Logf("second daemon refused: %s", tail(strings.TrimSpace(string(out)), 1))
	checkAlive(t, "daemon A's zygote after a second daemon tried its data dir", zygotes)
	mustRun(t, sa, "true")
}

// privateDir returns a fresh directory under /tmp that the sandboxes'
// uids can traverse (t.TempDir's parent is 0700), removed when t ends.
func privateDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("/tmp", "abx-"+randHex(4))
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestAdversarialTwoDaemonsOneSocketDir: a second daemon (own data dir)
// whose socket is in the first one's socket directory is refused; it used
// to start and sweep the first daemon's guest sockets, which no record of
// its own claims, cutting the first daemon off from its sandboxes.
func TestAdversarialTwoDaemonsOneSocketDir(t *testing.T) {
	a := newDaemon(t)
	sa := a.create(t, agentbox.SandboxSpec{})
	socks, _ := filepath.Glob(filepath.Join(filepath.Dir(a.socket), "sb", "*.sock"))
	if len(socks) == 0 {
		t.Fatal("daemon A has no guest sockets")
	}
	dir := privateDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentboxBin(t), "serve", "--data-dir", filepath.Join(dir, "data"), "--socket", filepath.Join(filepath.Dir(a.socket), "other.sock"))
	cmd.Env = append(os.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(dir, "secrets.key"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Logf("second daemon exited: %v", err)
	case <-time.After(5 * time.Second):
		t.Errorf("a second daemon with its socket in %s was not refused", filepath.Dir(a.socket))
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}
	for _, s := range socks {
		if _, err := os.Lstat(s); err != nil {
			t.Errorf("daemon A's guest socket %s: %v", s, err)
		}
	}
	mustRun(t, sa, "true")
}

// TestAdversarialTwoDaemonsExplicitParentLocked: two daemons configured
// with the same cgroup parent cannot both run.
func TestAdversarialTwoDaemonsExplicitParentLocked(t *testing.T) {
	testutil.RequiresRoot(t)
	parent := "abx-shared-" + randHex(4)
	t.Setenv("AGENTBOX_CGROUP_PARENT", parent)
	t.Cleanup(func() { removeCgroupParent(t, parent) })
	a := newDaemon(t)
	sa := a.create(t, agentbox.SandboxSpec{})
	dir := privateDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentboxBin(t), "serve", "--data-dir", filepath.Join(dir, "data"), "--socket", filepath.Join(dir, "s.sock"))
	cmd.Env = append(os.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(dir, "secrets.key"))
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "owned by another agentbox daemon") {
		t.Fatalf("a second daemon on cgroup parent %s was not refused (err %v):\n%s", parent, err, out)
	}
	mustRun(t, sa, "true")
}
