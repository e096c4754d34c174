package test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestE2BHostRouting: with a service domain, `agentbox serve --e2b`
// routes E2B's host-based sandbox addresses, {port}-{id}.{domain}, as the
// SDK builds them without E2B_SANDBOX_URL (no real DNS: the client dials
// the E2B listener for every host name). 49983 is envd and 49999 the code
// interpreter, under the sandbox's E2B tokens; any other port is a
// service URL, opened by its exposure token only. Attacks from another
// tenant (its own sandbox's token, its key) find nothing.
func TestE2BHostRouting(t *testing.T) {
	addr, e2bAddr := loopbackAddr(t), loopbackAddr(t)
	const domain = "sb.test"
	d := newDaemonWith(t, "--tcp", addr, "--e2b", e2bAddr, "--e2b-template", "base=busybox", "--service-domain", domain)
	base, e2bURL := "http://"+addr, "http://"+e2bAddr
	a, keyA := tenantClient(t, d, base, "host-a", api.Quotas{}, api.ScopeFull)
	_, keyB := tenantClient(t, d, base, "host-b", api.Quotas{}, api.ScopeFull)
	type created struct {
		SandboxID, EnvdAccessToken, TrafficAccessToken string
		Domain                                         *string
	}
	create := func(key string) created {
		st, b := e2bCall(t, e2bURL, "POST", "/v2/sandboxes", map[string]string{"X-API-KEY": key}, `{"timeout":300}`)
		var c created
		if err := json.Unmarshal(b, &c); st != 201 || err != nil || c.EnvdAccessToken == "" || c.TrafficAccessToken == "" {
			t.Fatalf("create: %d %s", st, b)
		}
		if c.Domain == nil || *c.Domain != domain {
			t.Fatalf("create: domain %v, want %s", c.Domain, domain)
		}
		return c
	}
	sa, sb := create(keyA.Key), create(keyB.Key)

	hc := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, network, e2bAddr)
		}},
		Timeout: time.Minute,
	}
	get := func(host, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", "http://"+host+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	host := func(port, id string) string { return port + "-" + id + "." + domain }
	envdTok := func(c created) map[string]string { return map[string]string{"X-Access-Token": c.EnvdAccessToken} }
	trafficTok := func(c created) map[string]string {
		return map[string]string{"E2B-Traffic-Access-Token": c.TrafficAccessToken}
	}

	// envd by host, with the sandbox's envd token only.
	if st, body := get(host("49983", sa.SandboxID), "/files?path=/etc/passwd", envdTok(sa)); st != 200 || !strings.Contains(body, "user:") {
		t.Fatalf("envd by host: %d %q", st, body)
	}
	for name, hdr := range map[string]map[string]string{
		"no token": nil, "the traffic token": trafficTok(sa), "B's token": envdTok(sb),
		"A's key": {"X-API-KEY": keyA.Key},
	} {
		if st, _ := get(host("49983", sa.SandboxID), "/files?path=/etc/passwd", hdr); st != 401 {
			t.Errorf("envd of A's sandbox with %s: %d, want 401", name, st)
		}
	}
	// Ports are canonical in the host too.
	for _, p := range []string{"049983", "0xc34f"} {
		if st, _ := get(host(p, sa.SandboxID), "/health", envdTok(sa)); st != 400 {
			t.Errorf("port %s in the host: %d, want 400", p, st)
		}
	}

	// The code interpreter's port: its server starts on first use (a run
	// of trigger e2b, as the user "user"), under the traffic token or the
	// envd token; B's tokens do not open A's.
	if st, body := get(host("49999", sa.SandboxID), "/health", trafficTok(sa)); st != 200 || !strings.Contains(body, "OK") {
		t.Fatalf("code interpreter by host with the traffic token: %d %q", st, body)
	}
	if st, _ := get(host("49999", sa.SandboxID), "/contexts", envdTok(sa)); st != 200 {
		t.Errorf("code interpreter by host with the envd token: %d", st)
	}
	if st, _ := get(host("49999", sa.SandboxID), "/health", trafficTok(sb)); st != 401 {
		t.Errorf("A's code interpreter with B's traffic token: %d, want 401", st)
	}
	// Through the headers (E2B_SANDBOX_URL) it is the same server.
	if st, _ := e2bCall(t, e2bURL, "GET", "/contexts", map[string]string{"E2b-Sandbox-Id": sa.SandboxID, "E2b-Sandbox-Port": "49999", "E2B-Traffic-Access-Token": sa.TrafficAccessToken}, ""); st != 200 {
		t.Errorf("code interpreter by headers: %d", st)
	}
	ctx := context.Background()
	sbxA, err := a.Get(ctx, sa.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	// A server that went away (killed inside here; a restore without its
	// processes in life) is started again by the request that finds it
	// gone, and that request, its body included, is served.
	mustRun(t, sbxA, `for p in /proc/[0-9]*; do if tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q 'guest code-[s]erver'; then kill ${p#/proc/}; fi; done`)
	waitGone := "for i in $(seq 100); do wget -qO- http://127.0.0.1:49999/health >/dev/null 2>&1 || exit 0; sleep 0.1; done; exit 1"
	mustRun(t, sbxA, waitGone)
	req, _ := http.NewRequest("POST", "http://"+host("49999", sa.SandboxID)+"/contexts", strings.NewReader(`{"language":"cobol"}`))
	req.Header.Set("E2B-Traffic-Access-Token", sa.TrafficAccessToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "cobol") {
		t.Errorf("a request after the server went away: %d %s, want the server's 400 about cobol", resp.StatusCode, b)
	}
	runs, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: sa.SandboxID})
	if err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, r := range runs {
		if len(r.Cmd) == 4 && r.Cmd[2] == "code-client" && r.Cmd[3] == "start" {
			starts++
			if r.Trigger != api.TriggerE2B || r.Tenant != "host-a" || r.ExitCode == nil || *r.ExitCode != 0 {
				t.Errorf("code server start run: %+v", r)
			}
		}
	}
	if starts != 2 {
		t.Errorf("code server starts: %d, want 2 (runs %+v)", starts, runs)
	}

	// Any other port is a service URL: the E2B tokens do not open it, an
	// exposure's token does.
	startService(t, sbxA, 8080)
	svc := host("8080", sa.SandboxID)
	for name, hdr := range map[string]map[string]string{"the envd token": envdTok(sa), "the traffic token": trafficTok(sa), "no token": nil} {
		if st, _ := get(svc, "/hello", hdr); st != 404 {
			t.Errorf("an unexposed port with %s: %d, want 404", name, st)
		}
	}
	x, err := sbxA.Expose(ctx, 8080, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st, body := get(svc, "/hello", map[string]string{api.ServiceTokenHeader: x.Token}); st != 200 || body != "hello from inside\n" {
		t.Errorf("the exposed port with its token: %d %q", st, body)
	}
	if st, _ := get(svc, "/hello", envdTok(sa)); st != 404 {
		t.Errorf("the exposed port with the envd token: %d, want 404", st)
	}
	if st, _ := get(host("8080", sb.SandboxID), "/hello", map[string]string{api.ServiceTokenHeader: x.Token}); st != 404 {
		t.Errorf("B's sandbox with A's exposure token: %d, want 404", st)
	}
}
