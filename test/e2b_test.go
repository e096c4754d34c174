package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestE2BSDK drives `agentbox serve --e2b` with the real E2B JavaScript
// SDK, pinned by test/e2bclient/package-lock.json, over plain HTTP with
// E2B_API_URL and E2B_SANDBOX_URL pointing at it (test/e2bclient/
// flows.mjs: create with metadata and timeout, commands with streaming,
// exit errors, background with stdin, kill, files, list, getInfo,
// setTimeout, metrics, PTY, pause and connect, snapshot and a sandbox
// from it, fork, not-found errors for unknown ids and another tenant's
// sandbox). Then it checks that the commands were runs of trigger e2b of
// that tenant, and that the other tenant's sandbox was left alone.
func TestE2BSDK(t *testing.T) {
	dir := npmClientDir(t, "e2bclient", "flows.mjs")
	addr, e2bAddr := loopbackAddr(t), loopbackAddr(t)
	// busybox stands in for E2B's base (debian by default) to keep the
	// test from building a Debian template.
	d := newDaemonWith(t, "--tcp", addr, "--e2b", e2bAddr, "--e2b-template", "base=busybox")
	base := "http://" + addr
	ctx := context.Background()
	a, keyA := tenantClient(t, d, base, "e2b-a", api.Quotas{}, api.ScopeFull)
	b, _ := tenantClient(t, d, base, "e2b-b", api.Quotas{}, api.ScopeFull)
	other, err := b.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("tenant B create: %v", err)
	}
	defer other.Delete(context.WithoutCancel(ctx))

	cmd := exec.Command("node", "flows.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL=http://"+e2bAddr, "E2B_SANDBOX_URL=http://"+e2bAddr,
		"E2B_API_KEY="+keyA.Key, "OTHER_SANDBOX="+other.ID(), "RUN="+randHex(6))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("E2B flows: %v\nstdout: %s\nstderr: %s", err, tail(stdout.String(), 2000), tail(stderr.String(), 4000))
	}
	var res struct {
		Sandbox string   `json:"sandbox"`
		Made    []string `json:"made"`
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Sandbox == "" {
		t.Fatalf("E2B flows: no result line: %q (%v)", stdout.String(), err)
	}

	// The SDK's commands are runs of the one pipeline: trigger e2b, the
	// tenant of the key, by the key (set-up) or the sandbox's token.
	runs, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: res.Sandbox})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) < 8 {
		t.Fatalf("runs of sandbox %s: %d, want the flows' commands: %+v", res.Sandbox, len(runs), runs)
	}
	for _, r := range runs {
		byKey := r.Who == "e2b:tenant:e2b-a/key:"+keyA.ID
		byToken := r.Who == "e2b-envd:tenant:e2b-a"
		if r.Trigger != api.TriggerE2B || r.Tenant != "e2b-a" || !(byKey || byToken) {
			t.Errorf("run %s: trigger %q tenant %q who %q, want trigger e2b of tenant e2b-a", r.ID, r.Trigger, r.Tenant, r.Who)
		}
	}
	if byTrigger, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: res.Sandbox, Trigger: api.TriggerE2B}); err != nil || len(byTrigger) != len(runs) {
		t.Errorf("runs?trigger=e2b: %d runs (%v), want %d", len(byTrigger), err, len(runs))
	}
	// Tenant B's sandbox ran nothing and still runs.
	if runs, err := b.Runs(ctx, agentbox.RunQuery{Sandbox: other.ID()}); err != nil || len(runs) != 0 {
		t.Errorf("tenant B's runs: %v, %v; want none", runs, err)
	}
	if sb, err := b.Get(ctx, other.ID()); err != nil || sb.Info().State != api.StateRunning {
		t.Errorf("tenant B's sandbox after the E2B flows: %v; want running", err)
	}
	// The flows' sandboxes are tenant A's: what they killed is gone, the
	// first one is left running.
	if sb, err := a.Get(ctx, res.Sandbox); err != nil || sb.Info().Labels["e2b.metadata/suite"] != "e2b" {
		t.Errorf("the flows' sandbox through agentbox's API: %v", err)
	}
	for _, id := range res.Made[1:] {
		if _, err := a.Get(ctx, id); !agentbox.IsNotFound(err) {
			t.Errorf("sandbox %s the flows killed: %v, want not found", id, err)
		}
	}
}
