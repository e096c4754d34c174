package test

import (
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Issue 17, finding 1: `exec -t` on a terminal that reports 0x0 (script's
// pty, a CI runner) runs with 24x80 instead of failing.
func TestExecTTYZeroSizeTerminal(t *testing.T) {
	testutil.RequiresBinary(t, "script") // script(1), Debian's essential bsdutils: a pty that reports 0x0
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	line := agentboxBin(t) + " --host unix://" + d.socket + " exec -t " + sb.ID() + " -- stty size"
	out, err := exec.Command("script", "-qec", line, "/dev/null").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "24 80" {
		t.Fatalf("exec -t on a 0x0 terminal: %v, %q; want \"24 80\"", err, out)
	}
}

// Issue 17, finding 2: a sandbox's name works wherever its id does (CLI,
// API, SDK); ls shows it; create by an existing name with other options
// is refused naming them; a name shaped like an id is refused.
func TestSandboxNamesWhereverIDs(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	out, errOut, code := d.cli(t, "create", "--name", "web1", "--memory", "256M")
	if code != 0 {
		t.Fatalf("create --name web1: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() { _ = d.client.Sandbox(id).Delete(context.Background()) })

	// CLI verbs.
	if out, errOut, code := d.cli(t, "exec", "web1", "--", "echo", "hi"); code != 0 || out != "hi\n" {
		t.Errorf("exec web1: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := d.cli(t, "inspect", "web1"); code != 0 || !strings.Contains(out, id) {
		t.Errorf("inspect web1: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := d.cli(t, "ls"); code != 0 || !regexp.MustCompile(`(?m)^ID\s+NAME\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+id+`\s+web1\s`).MatchString(out) {
		t.Errorf("ls: exit %d, %q %q; want a NAME column with web1", code, out, errOut)
	}
	if _, errOut, code := d.cli(t, "cp", "/etc/hostname", "web1:/root/h"); code != 0 {
		t.Errorf("cp to web1: exit %d %q", code, errOut)
	}
	// API.
	if status, body := d.rawRequest(t, "GET", "/v1/sandboxes/web1", nil); status != 200 || !strings.Contains(string(body), `"id":"`+id+`"`) {
		t.Errorf("GET /v1/sandboxes/web1: %d %s", status, body)
	}
	if status, body := d.rawRequest(t, "GET", "/v1/sandboxes/web1/fs/stat?path=/root/h", nil); status != 200 {
		t.Errorf("GET /v1/sandboxes/web1/fs/stat: %d %s", status, body)
	}
	if status, body := d.rawRequest(t, "GET", "/v1/sandboxes/web2", nil); status != 404 {
		t.Errorf("GET /v1/sandboxes/web2 (no such name): %d %s", status, body)
	}
	// SDK.
	sb, err := d.client.Get(ctx, "web1")
	if err != nil || sb.Info().ID != id {
		t.Fatalf("SDK Get(web1): %v", err)
	}
	if got := mustRun(t, d.client.Sandbox("web1"), "cat /root/h"); got == "" {
		t.Errorf("SDK run in web1: empty")
	}

	// Create by an existing name: the same options return it, other
	// options are refused, naming them.
	if out, errOut, code := d.cli(t, "create", "--name", "web1", "--memory", "256M"); code != 0 || strings.TrimSpace(out) != id {
		t.Errorf("create --name web1 again: exit %d %q %q", code, out, errOut)
	}
	_, errOut, code = d.cli(t, "create", "--name", "web1", "--memory", "512M", "--cpus", "0.5", "--lifecycle", "persistent")
	if code == 0 || !strings.Contains(errOut, "memory") || !strings.Contains(errOut, "cpus") || !strings.Contains(errOut, "lifecycle") {
		t.Errorf("create --name web1 with other options: exit %d %q; want refused naming memory, cpus and lifecycle", code, errOut)
	}
	if status, body := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"name":"web1","network":{"mode":"egress","allow":["example.com"]}}`)); status != 409 || !strings.Contains(string(body), "network") {
		t.Errorf("create web1 with another network: %d %s; want 409 naming network", status, body)
	}
	// A name that could be read as an id is refused.
	if status, body := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"name":"abcdef123456"}`)); status != 400 {
		t.Errorf("create with an id-shaped name: %d %s; want 400", status, body)
	}

	// rm by name.
	if out, errOut, code := d.cli(t, "rm", "web1"); code != 0 || strings.TrimSpace(out) != "web1" {
		t.Errorf("rm web1: exit %d %q %q", code, out, errOut)
	}
	if _, err := d.client.Get(ctx, id); !agentbox.IsNotFound(err) {
		t.Errorf("after rm web1, get %s: %v; want not found", id, err)
	}
}

// Issue 17, finding 2: names are per tenant; another tenant's name is 404
// exactly like an unknown one, and two tenants may use the same name.
func TestSandboxNamesPerTenant(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	a, keyA := tenantClient(t, d, base, "tenant-a", api.Quotas{}, api.ScopeFull)
	b, keyB := tenantClient(t, d, base, "tenant-b", api.Quotas{}, api.ScopeFull)
	sbA, err := a.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Name: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sbA.Delete(context.Background()) })
	status, _, body := rawCall(t, base, keyB.Key, "GET", "/v1/sandboxes/dev", nil)
	_, _, unknown := rawCall(t, base, keyB.Key, "GET", "/v1/sandboxes/nosuchname", nil)
	if status != 404 || !sameErrorShape(body, unknown) {
		t.Errorf("tenant B GET A's name: %d %s (unknown name: %s)", status, body, unknown)
	}
	if status, _, body := rawCall(t, base, keyB.Key, "DELETE", "/v1/sandboxes/dev", nil); status != 404 {
		t.Errorf("tenant B DELETE A's name: %d %s", status, body)
	}
	sbB, err := b.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Name: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sbB.Delete(context.Background()) })
	if sbB.ID() == sbA.ID() {
		t.Fatal("tenant B's create by name returned tenant A's sandbox")
	}
	for _, c := range []struct {
		key, want string
	}{{keyA.Key, sbA.ID()}, {keyB.Key, sbB.ID()}} {
		status, _, body := rawCall(t, base, c.key, "GET", "/v1/sandboxes/dev", nil)
		if status != 200 || !strings.Contains(string(body), c.want) {
			t.Errorf("GET /v1/sandboxes/dev: %d %s, want %s", status, body, c.want)
		}
	}
}

// sameErrorShape reports whether two error bodies have the same code.
func sameErrorShape(a, b []byte) bool {
	var ea, eb api.Error
	return json.Unmarshal(a, &ea) == nil && json.Unmarshal(b, &eb) == nil && ea.Code == eb.Code && ea.Code != ""
}

// Issue 17, finding 3: `fork CHECKPOINT_NAME` forks the named checkpoint,
// as restore accepts the name.
func TestForkByCheckpointName(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "echo v1 > /root/f")
	if _, errOut, code := d.cli(t, "checkpoint", "create", "--name", "before", sb.ID()); code != 0 {
		t.Fatalf("checkpoint create: exit %d %s", code, errOut)
	}
	out, errOut, code := d.cli(t, "fork", "before")
	if code != 0 {
		t.Fatalf("fork before: exit %d %q", code, errOut)
	}
	fid := strings.TrimSpace(out)
	fork := d.client.Sandbox(fid)
	t.Cleanup(func() { _ = fork.Delete(context.Background()) })
	if got := mustRun(t, fork, "cat /root/f"); got != "v1\n" {
		t.Errorf("fork of checkpoint before: /root/f = %q", got)
	}
}

// Issue 17, finding 9: error messages carry each prefix once, inspect of
// a missing sandbox prints nothing on stdout, a missing command exits 127
// and a non-executable one 126, ps shows the signal that killed a
// process.
func TestCLIMessagesAndExitCodes(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	id := sb.ID()
	// doubled fails when a message says the same thing twice: a prefix
	// ("exec in sandbox X: ") or the guest it came from, more than once.
	doubled := func(what, s string) {
		t.Helper()
		seen := map[string]bool{}
		for _, seg := range strings.Split(strings.TrimSpace(s), ": ") {
			if seen[seg] {
				t.Errorf("%s: %q repeats %q", what, s, seg)
			}
			seen[seg] = true
		}
		for _, p := range []string{"in sandbox", "guest"} {
			if strings.Count(s, p) > 1 {
				t.Errorf("%s: %q repeats %q", what, s, p)
			}
		}
	}
	_, errOut, code := d.cli(t, "exec", id, "--", "nosuchcommand")
	if code != 127 {
		t.Errorf("exec of a missing command: exit %d %q, want 127", code, errOut)
	}
	doubled("exec nosuchcommand", errOut)
	_, errOut, code = d.cli(t, "exec", id, "--", "/nosuch/cmd")
	if code != 127 {
		t.Errorf("exec of a missing path: exit %d %q, want 127", code, errOut)
	}
	_, errOut, code = d.cli(t, "exec", id, "--", "/etc/passwd")
	if code != 126 {
		t.Errorf("exec of a non-executable file: exit %d %q, want 126", code, errOut)
	}
	doubled("exec /etc/passwd", errOut)
	_, errOut, _ = d.cli(t, "attach", id, "4242")
	doubled("attach 4242", errOut)
	_, errOut, _ = d.cli(t, "cp", id+":/nosuch", "/tmp/")
	doubled("cp from /nosuch", errOut)

	out, errOut, code := d.cli(t, "inspect", "missing")
	if code == 0 || out != "" || !strings.Contains(errOut, "missing") {
		t.Errorf("inspect missing: exit %d, stdout %q, stderr %q; want an error and nothing on stdout", code, out, errOut)
	}

	out, errOut, code = d.cli(t, "exec", "-d", id, "--", "sleep", "300")
	if code != 0 {
		t.Fatalf("exec -d: exit %d %s", code, errOut)
	}
	pid := strings.TrimSpace(out)
	if _, errOut, code := d.cli(t, "kill", id, pid, "KILL"); code != 0 {
		t.Fatalf("kill: exit %d %s", code, errOut)
	}
	if _, errOut, code := d.cli(t, "attach", "--no-replay", id, pid); code != 137 {
		t.Errorf("attach to the killed process: exit %d %s, want 137", code, errOut)
	}
	out, _, _ = d.cli(t, "ps", id)
	if !regexp.MustCompile(`(?m)^` + pid + `\s.*killed \(SIGKILL\)`).MatchString(out) {
		t.Errorf("ps: %q; want pid %s shown killed (SIGKILL)", out, pid)
	}
}

// Issue 17, finding 9: an OOM kill reaches the client as such: the exec
// result says oom_killed and the CLI says so on stderr.
func TestExecOOMKilledReported(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{MemoryBytes: 64 << 20}})
	res := run(t, sb, "exec tail -c 300000000 /dev/zero")
	if res.Signal != "KILL" || !res.OOMKilled {
		t.Errorf("SDK result: exit %d signal %q oom_killed %v; want KILL and oom_killed", res.ExitCode, res.Signal, res.OOMKilled)
	}
	_, errOut, code := d.cli(t, "exec", sb.ID(), "--", "tail", "-c", "300000000", "/dev/zero")
	if code != 137 || !strings.Contains(errOut, "out of memory") {
		t.Errorf("CLI: exit %d, stderr %q; want 137 and an out-of-memory message", code, errOut)
	}
}
