package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// Issue 17, finding 10: secrets and egress from the CLI.

// cliIn runs the agentbox CLI against d with stdin as its standard input
// and returns its stdout, stderr and exit code.
func (d *daemon) cliIn(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(agentboxBin(t), append([]string{"--host", "unix://" + d.socket}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("agentbox %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// TestSecretSetFromStdin: `printf v | agentbox secret set N` stores v (stdin
// is read when it is not a terminal), and so does `secret set N -`; the
// values reach a command through --secret.
func TestSecretSetFromStdin(t *testing.T) {
	d := newDaemon(t)
	if _, errOut, code := d.cliIn(t, "v1", "secret", "set", "one"); code != 0 {
		t.Fatalf("printf v1 | secret set one: exit %d: %s", code, errOut)
	}
	if _, errOut, code := d.cliIn(t, "v2\n", "secret", "set", "two", "-"); code != 0 {
		t.Fatalf("secret set two -: exit %d: %s", code, errOut)
	}
	if _, errOut, code := d.cliIn(t, "", "secret", "set", "empty"); code == 0 || !strings.Contains(errOut, "empty") {
		t.Fatalf("an empty stdin: exit %d: %s", code, errOut)
	}
	out, errOut, code := d.cli(t, "secret", "ls")
	if code != 0 || !strings.Contains(out, "one") || !strings.Contains(out, "two") {
		t.Fatalf("secret ls: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = d.cli(t, "create")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, errOut, code := d.cli(t, "exec", "--secret", "one=A", "--secret", "two=B", id, "--", "sh", "-c", `test "$A" = v1 && test "$B" = v2`); code != 0 {
		t.Fatalf("the stored values differ: exit %d: %s", code, errOut)
	}
}

// TestEgressCredentialCLI: credential rules are added, listed and removed
// with `agentbox egress credential`, and the sandbox's policy shows them.
func TestEgressCredentialCLI(t *testing.T) {
	d := newDaemon(t)
	if _, errOut, code := d.cliIn(t, "tok", "secret", "set", "gh"); code != 0 {
		t.Fatalf("secret set: exit %d: %s", code, errOut)
	}
	out, errOut, code := d.cli(t, "create", "--allow-host", "example.test")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, errOut, code := d.cli(t, "egress", "credential", "add", id, "gh", "api.example.test", "--port", "8443", "--header", "X-Token", "--format", "token {secret}", "--method", "GET", "--path-prefix", "/v1/"); code != 0 {
		t.Fatalf("egress credential add: exit %d: %s", code, errOut)
	}
	out, errOut, code = d.cli(t, "--json", "inspect", id)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, errOut)
	}
	var sbs []api.Sandbox
	if err := json.Unmarshal([]byte(out), &sbs); err != nil || len(sbs) != 1 || sbs[0].Network == nil {
		t.Fatalf("inspect output %q: %v", out, err)
	}
	want := api.CredentialRule{Secret: "gh", Host: "api.example.test", Port: 8443, Header: "X-Token", Format: "token {secret}", Methods: []string{"GET"}, PathPrefix: "/v1/"}
	if got := sbs[0].Network.Credentials; len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(want) || len(sbs[0].Network.Allow) != 1 {
		t.Fatalf("network after credential add: %+v", sbs[0].Network)
	}
	out, errOut, code = d.cli(t, "egress", "credential", "ls", id)
	if code != 0 || !strings.Contains(out, "gh") || !strings.Contains(out, "api.example.test:8443") || !strings.Contains(out, "X-Token") {
		t.Fatalf("egress credential ls: exit %d: %s%s", code, out, errOut)
	}
	if _, errOut, code := d.cli(t, "egress", "credential", "rm", id, "gh", "nosuch.test"); code == 0 {
		t.Fatalf("removing a rule that is not there: exit 0: %s", errOut)
	}
	if _, errOut, code := d.cli(t, "egress", "credential", "rm", id, "gh", "api.example.test"); code != 0 {
		t.Fatalf("egress credential rm: exit %d: %s", code, errOut)
	}
	out, _, _ = d.cli(t, "egress", "credential", "ls", id)
	if strings.Contains(out, "api.example.test") {
		t.Fatalf("rule still listed after rm: %s", out)
	}
}

// TestEgressServeFlagsAndHostAlias: the egress hosts file, CA file and
// storage driver are `serve` flags; inside a sandbox the host's loopback
// is host.agentbox.internal (127.0.0.1 is the sandbox's own, and
// NO_PROXY), reachable when the daemon permits it; allowing 127.0.0.1
// says so.
func TestEgressServeFlagsAndHostAlias(t *testing.T) {
	out, err := exec.Command(agentboxBin(t), "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("serve --help: %v: %s", err, out)
	}
	for _, f := range []string{"--egress-hosts-file", "--egress-ca-file", "--egress-permit", "--storage-driver"} {
		if !strings.Contains(string(out), f) {
			t.Errorf("serve --help does not list %s", f)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the host") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 named.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := newDaemonWith(t, "--egress-permit", fmt.Sprintf("127.0.0.1:%d", port), "--egress-hosts-file", hosts, "--storage-driver", "copy")
	if out, _, code := d.cli(t, "info"); code != 0 || !strings.Contains(out, "copy") {
		t.Fatalf("info with --storage-driver copy: exit %d: %s", code, out)
	}

	out2, errOut, code := d.cli(t, "create", "--allow-host", fmt.Sprintf("host.agentbox.internal:%d", port), "--allow-host", fmt.Sprintf("named.test:%d", port))
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	if strings.Contains(errOut, "loopback") {
		t.Errorf("create warned about loopback without reason: %s", errOut)
	}
	id := strings.TrimSpace(out2)
	for _, host := range []string{"host.agentbox.internal", "named.test"} {
		out, errOut, code := d.cli(t, "exec", id, "--", "wget", "-q", "-O", "-", fmt.Sprintf("http://%s:%d/", host, port))
		if code != 0 || out != "hello from the host" {
			t.Errorf("wget http://%s:%d/ inside: exit %d: %q %s", host, port, code, out, errOut)
		}
	}

	_, errOut, code = d.cli(t, "create", "--allow-host", fmt.Sprintf("127.0.0.1:%d", port))
	if code != 0 || !strings.Contains(errOut, "host.agentbox.internal") {
		t.Fatalf("create --allow-host 127.0.0.1:PORT: exit %d, want a hint naming host.agentbox.internal on stderr: %s", code, errOut)
	}
}
