package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime/gvisor"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// requiresRunsc gates a test on gVisor's runsc, which CI installs with
// scripts/install-deps.sh.
func requiresRunsc(t *testing.T) string {
	t.Helper()
	testutil.RequiresRoot(t)
	p, err := gvisor.FindRunsc("")
	testutil.Requires(t, err == nil, "gVisor's runsc (scripts/install-deps.sh builds it into "+gvisor.CachedPath()+")")
	return p
}

// gvisorLeft lists what of sandbox id the gvisor backend of d left on the
// host: host mounts of it under the daemon's directory, its bundle, runsc's
// record of the container, its cgroups, and processes naming it.
func (d *daemon) gvisorLeft(t *testing.T, runsc, id string) []string {
	t.Helper()
	root := filepath.Join(filepath.Dir(d.socket), "gvisor")
	var out []string
	for _, m := range hostMountsUnder(d.dir) {
		if strings.Contains(m, "/"+id) {
			out = append(out, "mount "+m)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "b", id)); err == nil {
		out = append(out, "bundle "+id)
	}
	if b, err := exec.Command(runsc, "--root="+filepath.Join(root, "runsc"), "list", "-quiet").Output(); err == nil && strings.Contains(string(b), id) {
		out = append(out, "runsc container "+id)
	}
	for _, h := range hierarchyRoots() {
		if _, err := os.Stat(filepath.Join(h, d.parent+"-gvisor", id)); err == nil {
			out = append(out, "cgroup "+filepath.Join(h, d.parent+"-gvisor", id))
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "runsc") && strings.Contains(string(b), id) {
			out = append(out, "process "+filepath.Dir(p))
		}
	}
	return out
}

// TestGvisorSandbox drives a `--runtime gvisor` sandbox through the real
// daemon as a user does: create, exec (its kernel is the sentry's), files
// in and out, a filesystem checkpoint and a restore of it, pause and
// resume, a fork (on gvisor too), and delete, after which nothing of it
// is left on the host.
func TestGvisorSandbox(t *testing.T) {
	runsc := requiresRunsc(t)
	d := newDaemon(t)
	ctx := context.Background()

	out, errOut, code := d.cli(t, "create", "--runtime", "gvisor")
	if code != 0 {
		t.Fatalf("create --runtime gvisor: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	sb, err := d.client.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Info().Backend != "gvisor" {
		t.Errorf("backend = %q, want gvisor", sb.Info().Backend)
	}
	out, _, _ = d.cli(t, "inspect", id)
	var infos []api.Sandbox
	if json.Unmarshal([]byte(out), &infos) != nil || len(infos) != 1 || infos[0].Backend != "gvisor" {
		t.Errorf("inspect %s = %s; want backend gvisor", id, out)
	}
	// The kernel answering is gVisor's, and the sandbox is its own
	// computer: its hostname, root as uid 0, exit codes propagate.
	if got := mustRun(t, sb, "uname -r; hostname; id -u"); !strings.Contains(got, "gvisor") || !strings.Contains(got, id+"\n0\n") {
		t.Errorf("uname/hostname/id = %q; want a gvisor kernel, hostname %s, uid 0", got, id)
	}
	if res := run(t, sb, "exit 7"); res.ExitCode != 7 {
		t.Errorf("exit code = %d, want 7", res.ExitCode)
	}

	// Files both ways.
	if err := sb.WriteFile(ctx, "/root/in.txt", []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, sb, "cat /root/in.txt; echo made inside > /root/out.txt"); got != "from the host\n" {
		t.Errorf("file written through the API reads %q inside", got)
	}
	if b, err := sb.ReadFile(ctx, "/root/out.txt"); err != nil || string(b) != "made inside\n" {
		t.Errorf("file made inside reads %q, %v", b, err)
	}

	// A filesystem checkpoint, a change, and the restore undoing it.
	ck, err := sb.Checkpoint(ctx, "before")
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	mustRun(t, sb, "rm /root/in.txt; echo later > /root/later.txt")
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := mustRun(t, sb, "cat /root/in.txt; ls /root"); got != "from the host\nin.txt\nout.txt\n" {
		t.Errorf("after restore: %q", got)
	}

	// Pause and resume.
	if err := sb.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info().State != api.StatePaused {
		t.Errorf("state after pause: %s, %v", sb.Info().State, err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := mustRun(t, sb, "echo awake"); got != "awake\n" {
		t.Errorf("after resume: %q", got)
	}

	// Hibernate (no process left, files kept) and wake on the next call.
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatalf("hibernate: %v", err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info().State != api.StateHibernated {
		t.Errorf("state after hibernate: %s, %v", sb.Info().State, err)
	}
	if left := d.gvisorLeft(t, runsc, id); len(left) > 0 {
		t.Errorf("hibernated, yet on the host: %v", left)
	}
	if got := mustRun(t, sb, "cat /root/out.txt; uname -r"); !strings.HasPrefix(got, "made inside\n") || !strings.Contains(got, "gvisor") {
		t.Errorf("after wake: %q", got)
	}

	// A fork of the sandbox runs on gvisor too, on the checkpoint's files.
	forks, err := sb.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	fk := forks[0]
	if fk.Info().Backend != "gvisor" {
		t.Errorf("fork backend = %q, want gvisor", fk.Info().Backend)
	}
	if got := mustRun(t, fk, "cat /root/out.txt; uname -r"); !strings.HasPrefix(got, "made inside\n") || !strings.Contains(got, "gvisor") {
		t.Errorf("fork sees %q", got)
	}

	for _, s := range []*agentbox.Sandbox{fk, sb} {
		if err := s.Delete(ctx); err != nil {
			t.Fatalf("delete %s: %v", s.ID(), err)
		}
		if left := d.gvisorLeft(t, runsc, s.ID()); len(left) > 0 {
			t.Errorf("after deleting %s: %v", s.ID(), left)
		}
	}
}

// TestGvisorRecover: a gvisor sandbox outlives its daemon's restart and is
// re-adopted by the next, its processes untouched.
func TestGvisorRecover(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	if _, err := sb.Start(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1000"}}); err != nil {
		t.Fatal(err)
	}
	before := mustRun(t, sb, "pidof sleep")
	d.restart(syscall.SIGTERM)
	got, err := d.client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got.Info().State != api.StateRunning || got.Info().Backend != "gvisor" {
		t.Errorf("after restart: %s on %q", got.Info().State, got.Info().Backend)
	}
	if after := mustRun(t, got, "pidof sleep"); after != before {
		t.Errorf("sleep's pid %q before the restart, %q after", before, after)
	}
}

// TestGvisorUnavailable: a daemon without runsc runs everything on
// native; info lists gvisor as unavailable and a create asking for it is
// refused (412 failed_precondition) saying how to install runsc, creating
// nothing.
func TestGvisorUnavailable(t *testing.T) {
	d := newDaemonWith(t, "--runsc", "/nonexistent/runsc")
	ctx := context.Background()
	status, body := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"runtime":"gvisor"}`))
	var apiErr api.Error
	if status != 412 || json.Unmarshal(body, &apiErr) != nil || apiErr.Code != "failed_precondition" || !strings.Contains(apiErr.Message, "install-deps") {
		t.Errorf("create on gvisor without runsc: %d %s; want 412 failed_precondition naming install-deps", status, body)
	}
	_, errOut, code := d.cli(t, "create", "--runtime", "gvisor")
	if code == 0 || !strings.Contains(errOut, `runtime "gvisor" is not available on this host`) {
		t.Errorf("create --runtime gvisor: exit %d: %s", code, errOut)
	}
	if sbs, err := d.client.List(ctx, nil); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes after the refused creates: %d, %v", len(sbs), err)
	}
	out, _, _ := d.cli(t, "info")
	if !strings.Contains(out, "Runtime gvisor:") || !strings.Contains(out, "unavailable") {
		t.Errorf("info does not list gvisor as unavailable:\n%s", out)
	}
	if got := mustRun(t, d.create(t, agentbox.SandboxSpec{}), "echo native"); got != "native\n" {
		t.Errorf("a native sandbox beside it: %q", got)
	}
}

// TestResourceBombsContainedGvisor: a fork bomb and a memory bomb in gvisor
// sandboxes stay inside their limits and a neighbour keeps answering. The
// fork bomb's sandbox lives on; the memory bomb takes its whole sandbox
// with it (the host's OOM killer picks
// the sentry: docs/GVISOR.md), where under native only the process dies;
// either way the limit holds and the host is untouched.
func TestResourceBombsContainedGvisor(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	neighbour := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	ctx := context.Background()

	t.Run("ForkBomb", func(t *testing.T) {
		// The sentry holds the bomb (RLIMIT_NPROC: fork fails with
		// EAGAIN inside, as under native's pids.max), the host cgroup's
		// backstop (2×64+256 tasks: the sentry's own threads) is never
		// reached, and the sandbox lives on.
		sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor", Resources: apiResources(0, 0, 64)})
		res, err := sb.Run(ctx, `bomb() { bomb | bomb & }; bomb; sleep 3; echo done`, agentbox.WithTimeout(20*time.Second))
		if err != nil || !strings.Contains(string(res.Stderr), "can't fork") {
			t.Errorf("fork bomb: %v; want it refused inside (stderr %.200q)", err, res.Stderr)
		}
		if out := mustRun(t, neighbour, "echo alive"); strings.TrimSpace(out) != "alive" {
			t.Fatalf("neighbour answered %q", out)
		}
		if n := countSandboxProcs(t, d, sb.ID()); n > 2*64+256 {
			t.Fatalf("sandbox has %d host tasks, over its host backstop", n)
		}
		if err := sb.Refresh(ctx); err != nil || sb.Info().State != api.StateRunning {
			t.Errorf("the bombed sandbox: %s, %v; want running", sb.Info().State, err)
		}
	})

	t.Run("MemoryBomb", func(t *testing.T) {
		sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor", Resources: apiResources(0, 64<<20, 0)})
		res, err := sb.Run(ctx, `dd if=/dev/zero bs=1M count=512 | sort > /dev/null; echo survived`, agentbox.WithTimeout(60*time.Second))
		if err == nil && res.ExitCode == 0 && strings.Contains(string(res.Stdout), "survived") {
			t.Errorf("512 MiB sorted under a 64 MiB limit: %q", res.Stdout)
		}
		if events := memoryOOMKills(t, sb.ID()); events == 0 {
			t.Fatalf("no OOM kill recorded in the sandbox's memory cgroup (exec: %v)", err)
		}
		if out := mustRun(t, neighbour, "echo alive"); strings.TrimSpace(out) != "alive" {
			t.Fatalf("neighbour answered %q", out)
		}
	})
}

// TestTemplateRuntime: a template may name the backend of its sandboxes;
// a create that names none runs there, one that names another runs there;
// a template naming no valid backend is refused.
func TestTemplateRuntime(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	ctx := context.Background()
	if _, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "sentried", Base: "busybox", Runtime: "gvisor",
	}}, nil); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, agentbox.SandboxSpec{Template: "sentried"})
	if sb.Info().Backend != "gvisor" || !strings.Contains(mustRun(t, sb, "uname -r"), "gvisor") {
		t.Errorf("sandbox of a gvisor template: backend %q", sb.Info().Backend)
	}
	if nat := d.create(t, agentbox.SandboxSpec{Template: "sentried", Runtime: "native"}); nat.Info().Backend != "native" {
		t.Errorf("asking for native on a gvisor template: backend %q", nat.Info().Backend)
	}
	if _, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "bad", Base: "busybox", Runtime: "Not A Backend",
	}}, nil); !agentbox.IsInvalidArgument(err) {
		t.Errorf("a template naming no valid backend: %v, want invalid argument", err)
	}
}
