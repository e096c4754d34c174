package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// The attacker of these tests stands on the host: an unprivileged host user
// (nobody), or a process that escaped sandbox A and so runs with A's host
// root uid. Neither may reach into any sandbox's files or gain privileges
// from files a sandbox planted (issue 11, finding 1).

// asUser runs argv on the host with the given real and effective uid/gid and
// no supplementary groups (setpriv), with extra as fds 3... It returns the
// combined output and the exit error.
func asUser(t *testing.T, uid, gid int, extra []*os.File, argv ...string) (string, error) {
	t.Helper()
	testutil.RequiresBinary(t, "setpriv")
	args := append([]string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", gid), "--clear-groups", "--"}, argv...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", args...)
	cmd.ExtraFiles = extra
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

const nobody = 65534

// upperOf is the host path of a sandbox's writable layer.
func (d *daemon) upperOf(id string) string {
	return filepath.Join(d.dataDir, "sandboxes", id, "upper")
}

// TestAdversarialHostUserCannotTraverseDataDir: a host user cannot stat or
// list anything below the data dir, in particular no sandbox's upper dir.
func TestAdversarialHostUserCannotTraverseDataDir(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "echo secret > /root-secret")
	upper := d.upperOf(sb.ID())
	if _, err := os.Stat(filepath.Join(upper, "root-secret")); err != nil {
		t.Fatalf("the sandbox's file is not in its upper dir %s: %v", upper, err)
	}
	fi, err := os.Stat(d.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("data dir %s has mode %#o, want no group or other bits", d.dataDir, perm)
	}
	// (The data dir itself can be stat'ed through its parent; nothing
	// below it can.)
	for _, p := range []string{
		filepath.Join(d.dataDir, "sandboxes"),
		filepath.Join(d.dataDir, "sandboxes", sb.ID()),
		upper,
		filepath.Join(upper, "root-secret"),
		filepath.Join(d.dataDir, "layers"),
	} {
		if out, err := asUser(t, nobody, nobody, nil, "stat", p); err == nil {
			t.Errorf("nobody can stat %s: %s", p, out)
		}
	}
	if out, err := asUser(t, nobody, nobody, nil, "cat", filepath.Join(upper, "root-secret")); err == nil {
		t.Errorf("nobody read a sandbox's file: %s", out)
	}
}

// TestAdversarialHostUserSetuidPlanted: a setuid binary planted in a
// sandbox's writable layer (files API or chmod inside) gives no host user
// any privilege: the path the upper dir lives on is nosuid,nodev, and even
// an exec through an fd handed over by root does not raise the euid.
func TestAdversarialHostUserSetuidPlanted(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shell, err := os.ReadFile("/bin/bash")
	testutil.Requires(t, err == nil, fmt.Sprintf("/bin/bash to plant as a setuid shell (the Debian base has it): %v", err))
	// Planted through the files API with the setuid bit, and through a
	// chmod inside.
	if err := sb.WriteFile(ctx, "/hsh", shell, 0o4755); err != nil {
		t.Fatalf("writing /hsh: %v", err)
	}
	mustRun(t, sb, "cp /hsh /hsh2 && chmod 4755 /hsh /hsh2")
	upper := d.upperOf(sb.ID())

	var st unix.Statfs_t
	if err := unix.Statfs(upper, &st); err != nil {
		t.Fatal(err)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Errorf("upper dir %s is on a mount with flags %#x: want nosuid and nodev", upper, st.Flags)
	}

	for _, name := range []string{"hsh", "hsh2"} {
		p := filepath.Join(upper, name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSetuid == 0 {
			t.Logf("%s lost its setuid bit on disk (fine)", p)
		}
		// By path, as nobody.
		if out, err := asUser(t, nobody, nobody, nil, p, "-p", "-c", "id -u"); err == nil && strings.TrimSpace(out) != fmt.Sprint(nobody) {
			t.Errorf("nobody ran %s and got euid %s", p, strings.TrimSpace(out))
		}
		// Through an fd root opened on the data dir's path: the mount's
		// nosuid still applies.
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		out, err := asUser(t, nobody, nobody, []*os.File{f}, "/proc/self/fd/3", "-p", "-c", "id -u")
		f.Close()
		if err != nil {
			t.Fatalf("exec of %s through an fd as nobody: %v: %s", p, err, out)
		}
		if got := strings.TrimSpace(out); got != fmt.Sprint(nobody) {
			t.Errorf("nobody exec'd the planted setuid %s and got euid %s, want %d", p, got, nobody)
		}
	}
}

// TestAdversarialHostUserEscapedRootOwnsNoOtherSandbox: a process running
// with sandbox A's host root uid/gid (what escaping A yields) can neither
// read nor write sandbox B's files, even handed an open fd of B's upper dir
// (so the data dir's own modes do not hide the result). A's host root is
// the uid a process inside A runs as, seen from the host.
func TestAdversarialHostUserEscapedRootOwnsNoOtherSandbox(t *testing.T) {
	d := newDaemon(t)
	a := d.create(t, agentbox.SandboxSpec{})
	b := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, b, "echo tenant-b > /secret && chmod 600 /secret && mkdir -p /priv && chmod 700 /priv")
	rootA, rootB := hostUID(t, d, a), hostUID(t, d, b)
	if rootA == 0 || rootB == 0 {
		t.Fatalf("sandbox root is host root (a %d, b %d)", rootA, rootB)
	}
	if rootA == rootB {
		t.Errorf("sandboxes %s and %s share host root uid %d", a.ID(), b.ID(), rootA)
	}
	upperB, err := os.Open(d.upperOf(b.ID()))
	if err != nil {
		t.Fatal(err)
	}
	defer upperB.Close()
	uid, gid := rootA, rootA
	if out, err := asUser(t, uid, gid, []*os.File{upperB}, "cat", "/proc/self/fd/3/secret"); err == nil {
		t.Errorf("A's host root (uid %d) read B's /secret: %q", uid, out)
	}
	if out, err := asUser(t, uid, gid, []*os.File{upperB}, "sh", "-c", "echo pwned > /proc/self/fd/3/pwned"); err == nil {
		t.Errorf("A's host root (uid %d) wrote into B's upper dir: %s", uid, out)
	}
	if out, err := asUser(t, uid, gid, []*os.File{upperB}, "ls", "/proc/self/fd/3/priv"); err == nil {
		t.Errorf("A's host root (uid %d) listed B's 0700 /priv: %s", uid, out)
	}
	if _, err := os.Stat(filepath.Join(d.upperOf(b.ID()), "pwned")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("B's upper dir has a file planted from A: %v", err)
	}
	// A's host root owns nothing of A's files on disk either: they stay in
	// the canonical range, which no process runs in.
	var st syscall.Stat_t
	mustRun(t, a, "echo mine > /mine")
	if err := syscall.Stat(filepath.Join(d.upperOf(a.ID()), "mine"), &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Uid) == rootA || int(st.Uid) == rootB {
		t.Errorf("A's file is owned on disk by a sandbox's host uid %d", st.Uid)
	}
	// Inside, each sandbox still sees its files as its own root's.
	if got := strings.TrimSpace(mustRun(t, a, "stat -c %u:%g /mine /bin/busybox")); got != "0:0\n0:0" {
		t.Errorf("inside A, owners are %q, want 0:0 twice", got)
	}
	if got := strings.TrimSpace(mustRun(t, b, "cat /secret")); got != "tenant-b" {
		t.Errorf("B's /secret reads %q", got)
	}
}

// hostUID is the host uid a process of sb runs as (its root), found on the
// host through a sleep with a unique argument.
func hostUID(t *testing.T, d *daemon, sb *agentbox.Sandbox) int {
	t.Helper()
	arg := fmt.Sprintf("%d", 1000000+time.Now().UnixNano()%8999999)
	mustRun(t, sb, "sleep "+arg+" >/dev/null 2>&1 &")
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		out, _ := exec.Command("pgrep", "-x", "-f", "sleep "+arg).Output()
		for _, pid := range strings.Fields(string(out)) {
			status, err := os.ReadFile("/proc/" + pid + "/status")
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(status), "\n") {
				if f := strings.Fields(line); len(f) >= 3 && f[0] == "Uid:" {
					var uid int
					_, _ = fmt.Sscan(f[2], &uid) // effective
					return uid
				}
			}
		}
	}
	t.Fatalf("no host process of sandbox %s found", sb.ID())
	return 0
}

// idRange is the id_range field of GET /v1/sandboxes/{id}.
type idRange struct {
	HostID uint32 `json:"host_id"`
	Size   uint32 `json:"size"`
}

func (d *daemon) inspectRange(t *testing.T, id string) idRange {
	t.Helper()
	code, body := d.rawRequest(t, "GET", "/v1/sandboxes/"+id, nil)
	if code != 200 {
		t.Fatalf("GET /v1/sandboxes/%s: %d %s", id, code, body)
	}
	var sb struct {
		IDRange *idRange `json:"id_range"`
	}
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.IDRange == nil || sb.IDRange.Size == 0 {
		t.Fatalf("GET /v1/sandboxes/%s reports no id_range: %s", id, body)
	}
	return *sb.IDRange
}

// TestAdversarialHostUserInspectIDRange: inspect (API and CLI) reports each
// sandbox's host id range; two sandboxes' ranges differ and do not overlap,
// and the range is the one the sandbox's files are owned by on the host.
func TestAdversarialHostUserInspectIDRange(t *testing.T) {
	d := newDaemon(t)
	a := d.create(t, agentbox.SandboxSpec{})
	b := d.create(t, agentbox.SandboxSpec{})
	ra, rb := d.inspectRange(t, a.ID()), d.inspectRange(t, b.ID())
	if ra.HostID < rb.HostID+rb.Size && rb.HostID < ra.HostID+ra.Size {
		t.Errorf("id ranges overlap: %s %+v, %s %+v", a.ID(), ra, b.ID(), rb)
	}
	if got := hostUID(t, d, a); got != int(ra.HostID) {
		t.Errorf("A's root runs as host uid %d, its id range starts at %d", got, ra.HostID)
	}
	out, err := exec.Command(agentboxBin(t), "--host", "unix://"+d.socket, "inspect", a.ID()).CombinedOutput()
	if err != nil {
		t.Fatalf("agentbox inspect: %v: %s", err, out)
	}
	if want := fmt.Sprintf(`"host_id": %d`, ra.HostID); !strings.Contains(string(out), `"id_range"`) || !strings.Contains(string(out), want) {
		t.Errorf("agentbox inspect %s does not show the id range start %s:\n%s", a.ID(), want, out)
	}
}

// TestAdversarialHostUserRangesSurviveRestart: a restarted daemon keeps a
// running sandbox's range and never hands it out again (to a new sandbox
// or a prespawned guest) while that sandbox lives.
func TestAdversarialHostUserRangesSurviveRestart(t *testing.T) {
	d := newDaemon(t)
	a := d.create(t, agentbox.SandboxSpec{})
	before := d.inspectRange(t, a.ID())
	// More sandboxes to recover: a restarted daemon that let prespawned
	// guests take ranges before recovery would lose the race for some.
	others := map[string]idRange{}
	for range 6 {
		o := d.create(t, agentbox.SandboxSpec{})
		others[o.ID()] = d.inspectRange(t, o.ID())
	}
	d.restart(syscall.SIGTERM)
	for id, r := range others {
		if after := d.inspectRange(t, id); after != r {
			t.Fatalf("%s's range changed over a restart: %+v -> %+v", id, r, after)
		}
	}
	if after := d.inspectRange(t, a.ID()); after != before {
		t.Fatalf("A's range changed over a restart: %+v -> %+v", before, after)
	}
	// Give the new daemon's prespawned guests time to start: a create
	// then takes one, with the range it was started in.
	time.Sleep(time.Second)
	// Concurrent creates take every waiting guest at once.
	sbs := make([]*agentbox.Sandbox, 4)
	var wg sync.WaitGroup
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i] = d.create(t, agentbox.SandboxSpec{})
		}()
	}
	wg.Wait()
	for _, b := range sbs {
		if b == nil {
			t.FailNow()
		}
		rb := d.inspectRange(t, b.ID())
		others[a.ID()] = before
		for id, r := range others {
			if rb.HostID < r.HostID+r.Size && r.HostID < rb.HostID+rb.Size {
				t.Fatalf("after a restart, new sandbox %s got %+v, overlapping running %s's %+v", b.ID(), rb, id, r)
			}
		}
		if got := hostUID(t, d, b); got != int(rb.HostID) {
			t.Fatalf("sandbox %s runs as host uid %d, its range starts at %d", b.ID(), got, rb.HostID)
		}
	}
	if got := hostUID(t, d, a); got != int(before.HostID) {
		t.Fatalf("A runs as host uid %d after the restart, its range starts at %d", got, before.HostID)
	}
	// Nothing (a prespawned guest started before recovery) took A's range
	// before the restarted daemon re-adopted it.
	if log, err := os.ReadFile(d.logPath); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(log), "recovered sandbox's id range") {
		t.Fatalf("the restarted daemon found a recovered sandbox's range already taken:\n%s", tail(string(log), 2000))
	}
}
