package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

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
	// No second execute path: the SDK's runs are metered and in the
	// sandbox's flight record like any other trigger's (run.started and
	// run.ended of each run, as the tenant).
	usage, err := a.Usage(ctx, res.Sandbox, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	finished := 0
	for _, r := range runs {
		if r.State != api.RunRunning {
			finished++
		}
	}
	if len(usage.Sandboxes) != 1 {
		t.Fatalf("usage of sandbox %s: %+v", res.Sandbox, usage.Sandboxes)
	}
	if tot := usage.Sandboxes[0].Totals; tot.ByTrigger[api.TriggerE2B].Runs < int64(finished) || tot.Runs != tot.ByTrigger[api.TriggerE2B].Runs || finished < len(runs)/2 {
		t.Errorf("usage of sandbox %s: %+v, want its %d runs (%d finished) metered under trigger e2b", res.Sandbox, tot, len(runs), finished)
	}
	events, err := a.Sandbox(res.Sandbox).QueryEvents(ctx, agentbox.EventQuery{Types: []string{"run"}})
	if err != nil {
		t.Fatal(err)
	}
	started, ended := map[string]int{}, map[string]int{}
	for _, ev := range events {
		if ev.Tenant != "e2b-a" {
			t.Errorf("event %d %s of tenant %q", ev.Seq, ev.Type, ev.Tenant)
		}
		switch ev.Type {
		case api.EventRunStarted:
			started[ev.RunID]++
		case api.EventRunEnded:
			ended[ev.RunID]++
		}
	}
	for _, r := range runs {
		if started[r.ID] != 1 || (r.State != api.RunRunning && ended[r.ID] != 1) {
			t.Errorf("flight record of run %s (%v, %s): %d run.started, %d run.ended; want one of each", r.ID, r.Cmd, r.State, started[r.ID], ended[r.ID])
		}
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

// e2bCall sends one request to the E2B listener and returns the status
// and body.
func e2bCall(t *testing.T, base, method, path string, hdr map[string]string, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A tenant attacking another's sandbox through the E2B listener, with
// everything it legitimately holds (its key, its own sandbox's access
// token): the other sandbox is not found on the control plane, and its
// envd refuses a token of another sandbox, a token whose owner part is
// rewritten, and no token.
func TestE2BAdversarialTokens(t *testing.T) {
	addr, e2bAddr := loopbackAddr(t), loopbackAddr(t)
	d := newDaemonWith(t, "--tcp", addr, "--e2b", e2bAddr, "--e2b-template", "base=busybox")
	base, e2b := "http://"+addr, "http://"+e2bAddr
	_, keyA := tenantClient(t, d, base, "adv-a", api.Quotas{}, api.ScopeFull)
	_, keyB := tenantClient(t, d, base, "adv-b", api.Quotas{}, api.ScopeFull)
	create := func(key string) (id, token string) {
		st, b := e2bCall(t, e2b, "POST", "/v2/sandboxes", map[string]string{"X-API-KEY": key}, `{"timeout":120}`)
		var c struct {
			SandboxID, EnvdAccessToken string
		}
		if err := json.Unmarshal(b, &c); st != 201 || err != nil || c.EnvdAccessToken == "" {
			t.Fatalf("create: %d %s", st, b)
		}
		return c.SandboxID, c.EnvdAccessToken
	}
	idA, tokA := create(keyA.Key)
	_, tokB := create(keyB.Key)
	envd := func(id, tok, path string) int {
		st, _ := e2bCall(t, e2b, "GET", path, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": tok}, "")
		return st
	}
	if st := envd(idA, tokA, "/files?path=/etc/passwd"); st != 200 {
		t.Fatalf("A reading its own file: %d", st)
	}
	_, mac, _ := strings.Cut(tokB, ".")
	forged := base64.RawURLEncoding.EncodeToString([]byte("adv-a")) + "." + mac
	for name, tok := range map[string]string{"B's token": tokB, "B's token claiming A": forged, "no token": ""} {
		if st := envd(idA, tok, "/files?path=/etc/passwd"); st != http.StatusUnauthorized {
			t.Errorf("%s on A's sandbox: %d, want 401", name, st)
		}
	}
	for _, p := range []string{"/sandboxes/" + idA, "/sandboxes/" + idA + "/metrics", "/sandboxes/" + idA + "/logs"} {
		st, b := e2bCall(t, e2b, "GET", p, map[string]string{"X-API-KEY": keyB.Key}, "")
		stU, bU := e2bCall(t, e2b, "GET", strings.ReplaceAll(p, idA, "zzzzzzzzzzzz"), map[string]string{"X-API-KEY": keyB.Key}, "")
		if st != 404 || stU != 404 || strings.ReplaceAll(string(b), idA, "ID") != strings.ReplaceAll(string(bU), "zzzzzzzzzzzz", "ID") {
			t.Errorf("B: GET %s: %d %s; unknown id: %d %s", p, st, b, stU, bU)
		}
	}
	if st, _ := e2bCall(t, e2b, "DELETE", "/sandboxes/"+idA, map[string]string{"X-API-KEY": keyB.Key}, ""); st != 404 {
		t.Errorf("B killing A's sandbox: %d", st)
	}
	if st := envd(idA, tokA, "/health"); st != 204 {
		t.Errorf("A's sandbox after B's attempts: %d", st)
	}
}
