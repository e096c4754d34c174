package test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// cli runs the agentbox CLI against d with an empty stdin and returns its
// stdout, stderr and exit code.
func (d *daemon) cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return d.cliIn(t, "", args...)
}

// TestCreateRuntime: `agentbox create --runtime native` makes a working
// sandbox that inspect reports on backend native; `--runtime nosuch` is
// refused (400) with a message naming the backends there are, creating
// nothing; info lists the backends with their capabilities, native the
// default.
func TestCreateRuntime(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()

	out, errOut, code := d.cli(t, "create", "--runtime", "native")
	if code != 0 {
		t.Fatalf("create --runtime native: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	sb, err := d.client.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, sb, "echo hi"); got != "hi\n" {
		t.Errorf("exec in the sandbox = %q", got)
	}
	out, errOut, code = d.cli(t, "inspect", id)
	var infos []api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &infos) != nil || len(infos) != 1 || infos[0].Backend != "native" {
		t.Errorf("inspect %s: exit %d, %s %s; want backend native", id, code, out, errOut)
	}

	_, errOut, code = d.cli(t, "create", "--runtime", "nosuch")
	if code == 0 || !strings.Contains(errOut, `runtime "nosuch": no such backend (this daemon runs native`) {
		t.Errorf("create --runtime nosuch: exit %d, stderr %q; want refused naming the backends", code, errOut)
	}
	status, body := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"runtime":"nosuch"}`))
	var apiErr api.Error
	if status != 400 || json.Unmarshal(body, &apiErr) != nil || apiErr.Code != "invalid_argument" {
		t.Errorf("POST /v1/sandboxes runtime nosuch: %d %s; want 400 invalid_argument", status, body)
	}
	if sbs, err := d.client.List(ctx, nil); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes after the refused creates: %d, %v; want 1", len(sbs), err)
	}

	out, errOut, code = d.cli(t, "info", "--json")
	var info api.Info
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil {
		t.Fatalf("info --json: exit %d: %s %s", code, out, errOut)
	}
	if info.Backend != "native" || len(info.Backends) != 2 || info.Backends[0].Name != "native" || !info.Backends[0].Default ||
		len(info.Backends[0].Capabilities) == 0 || strings.Join(info.Backends[0].Capabilities, ",") != strings.Join(info.Capabilities, ",") {
		t.Errorf("info: backend %q capabilities %v, backends %+v; want native, the default, with its capabilities, then gvisor", info.Backend, info.Capabilities, info.Backends)
	}
	// gvisor is listed too: running, with runsc's version and platform,
	// or unavailable, saying how to install runsc.
	if g := info.Backends[len(info.Backends)-1]; g.Name != "gvisor" || g.Default ||
		(g.Unavailable == "" && (g.Details["version"] == "" || g.Details["platform"] == "")) ||
		(g.Unavailable != "" && !strings.Contains(g.Unavailable, "install-deps")) {
		t.Errorf("info: gvisor backend %+v", g)
	}
	if out, _, _ := d.cli(t, "info"); !strings.Contains(out, "Runtime native:") || !strings.Contains(out, "default") {
		t.Errorf("info does not list the native runtime as the default:\n%s", out)
	}
}

// TestRecoverRuntime: a restarted daemon re-adopts a sandbox on the
// backend its record names; a daemon configured with a runtime it does not
// have refuses to start, saying so, and touches nothing: the next daemon
// finds the sandbox running.
func TestRecoverRuntime(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "native"})
	mustRun(t, sb, "echo kept > /tmp/kept")

	d.stop(syscall.SIGTERM)
	cmd := exec.Command(agentboxBin(t), "serve", "--data-dir", d.dataDir, "--socket", d.socket, "--runtime", "nosuch")
	cmd.Env = append(cmd.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+d.dir+"/secrets.key")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `runtime "nosuch": no such backend (this daemon has native, gvisor)`) {
		t.Errorf("serve --runtime nosuch: %v, %s; want refused naming the backends", err, out)
	}

	d.start()
	got, err := d.client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatalf("sandbox after restart: %v", err)
	}
	if info := got.Info(); info.State != api.StateRunning || info.Backend != "native" {
		t.Errorf("after restart: state %s backend %q; want running on native", info.State, info.Backend)
	}
	if out := mustRun(t, sb, "cat /tmp/kept"); out != "kept\n" {
		t.Errorf("file after restart = %q", out)
	}
}
