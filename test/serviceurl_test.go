package test

// Service URLs against the real daemon: a web server inside a sandbox
// (testdata/svcecho, built static and copied in) reached through the
// daemon's TCP listener by path (/v1/sandboxes/{id}/ports/{port}/) and by
// host ({port}-{id}.{domain}), over HTTP and WebSocket, and refused, with
// one answer, to everyone without the right token.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// svcEnv is a daemon serving service URLs on loopback TCP, with the
// domain svc.test resolved (by the client below) to that listener.
type svcEnv struct {
	d      *daemon
	addr   string
	base   string
	domain string
	hc     *http.Client // every host name dials the daemon's listener
}

func newSvcEnv(t *testing.T) *svcEnv {
	t.Helper()
	addr := loopbackAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	e := &svcEnv{addr: addr, base: "http://" + addr, domain: "svc.test:" + port}
	e.d = newDaemonWith(t, "--tcp", addr, "--service-domain", e.domain)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	e.hc = &http.Client{
		Transport:     &http.Transport{DialContext: dial},
		Timeout:       time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return e
}

// startService copies svcecho into sb and serves on port inside it.
func startService(t *testing.T, sb *agentbox.Sandbox, ports ...int) {
	t.Helper()
	bin := buildHelper(t, sb, "svcecho")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range ports {
		if _, err := sb.Start(ctx, api.ExecRequest{Command: bin + " serve " + strconv.Itoa(p)}); err != nil {
			t.Fatal(err)
		}
		// Ready when it answers inside.
		mustRun(t, sb, "for i in $(seq 100); do wget -qO- http://127.0.0.1:"+strconv.Itoa(p)+"/hello && exit 0; sleep 0.1; done; exit 1")
	}
}

// get sends GET url (Host host when not "") with hdr.
func (e *svcEnv) get(t *testing.T, url, host string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestServiceURLs(t *testing.T) {
	e := newSvcEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	acme, _ := tenantClient(t, e.d, e.base, "acme", api.Quotas{}, api.ScopeFull)
	other, otherKey := tenantClient(t, e.d, e.base, "other", api.Quotas{}, api.ScopeFull)

	sb, err := acme.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	startService(t, sb, 8080, 8081)
	x, err := sb.Expose(ctx, 8080, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	host := "8080-" + sb.ID() + "." + e.domain
	if x.URL != "http://"+host+"/" || x.Path != "/v1/sandboxes/"+sb.ID()+"/ports/8080/" || !strings.HasPrefix(x.Token, "abt1.") {
		t.Fatalf("exposure %+v", x)
	}
	tok := map[string]string{api.ServiceTokenHeader: x.Token}
	pathURL := e.base + x.Path

	// Reachable by path and by host, with the header or as a bearer; the
	// service never sees the token.
	for name, c := range map[string]struct {
		url, host string
		hdr       map[string]string
	}{
		"path":        {pathURL + "hello", "", tok},
		"host":        {"http://" + host + "/hello", "", tok},
		"path bearer": {pathURL + "hello", "", map[string]string{"Authorization": "Bearer " + x.Token}},
	} {
		if code, _, body := e.get(t, c.url, c.host, c.hdr); code != 200 || body != "hello from inside\n" {
			t.Fatalf("%s: %d %q", name, code, body)
		}
	}
	if _, _, body := e.get(t, pathURL+"headers", "", tok); strings.Contains(body, x.Token) || strings.Contains(strings.ToLower(body), "x-agentbox-token") {
		t.Fatalf("the service saw the token:\n%s", body)
	}

	// Streamed: the first line arrives before the response ends.
	req, _ := http.NewRequest("GET", pathURL+"stream", nil)
	req.Header.Set(api.ServiceTokenHeader, x.Token)
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "tick 0\n" || time.Since(start) > 250*time.Millisecond {
		t.Fatalf("first streamed line %q %v after %v (the server sleeps 300 ms between lines)", line, err, time.Since(start))
	}
	resp.Body.Close()

	// WebSocket, by path and by host.
	for _, wsURL := range []string{"ws://" + e.addr + x.Path + "ws", "ws://" + host + "/ws"} {
		cfg, err := websocket.NewConfig(wsURL, "http://"+host)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Header.Set(api.ServiceTokenHeader, x.Token)
		raw, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		ws, err := websocket.NewClient(cfg, raw)
		if err != nil {
			t.Fatalf("websocket %s: %v", wsURL, err)
		}
		for _, m := range []string{"ping", strings.Repeat("x", 100_000)} {
			if err := websocket.Message.Send(ws, m); err != nil {
				t.Fatal(err)
			}
			// The echo answers a long message in several frames.
			var got string
			for len(got) < len(m) {
				var part string
				if err := websocket.Message.Receive(ws, &part); err != nil {
					t.Fatalf("websocket %s: %v after %d bytes", wsURL, err, len(got))
				}
				got += part
			}
			if got != m {
				t.Fatalf("websocket %s echoed %d other bytes", wsURL, len(got))
			}
		}
		ws.Close()
	}

	// The refusals, all alike.
	x8081, err := sb.Expose(ctx, 8081, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sb2, err := acme.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Delete(context.WithoutCancel(ctx))
	x2, err := sb2.Expose(ctx, 8080, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sbO, err := other.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sbO.Delete(context.WithoutCancel(ctx))
	xO, err := sbO.Expose(ctx, 8080, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Sandbox(sb.ID()).Expose(ctx, 8080, time.Minute); !agentbox.IsNotFound(err) {
		t.Fatalf("another tenant exposed acme's sandbox: %v", err)
	}
	for _, p := range []int{3128, 3129} { // the egress proxy and the API bridge
		if _, err := sb.Expose(ctx, p, time.Minute); !agentbox.IsInvalidArgument(err) {
			t.Fatalf("exposing the platform's port %d: %v", p, err)
		}
	}
	xShort, err := sb.Expose(ctx, 8080, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	xRevoked, err := sb.Expose(ctx, 8080, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.RevokeExposure(ctx, xRevoked.ID); err != nil {
		t.Fatal(err)
	}
	if err := other.RevokeExposure(ctx, x.ID); !agentbox.IsNotFound(err) {
		t.Fatalf("another tenant revoked acme's exposure: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // xShort expires
	prefix := e.base + "/v1/sandboxes/" + sb.ID() + "/ports/"
	refusals := map[string]struct {
		url, host string
		hdr       map[string]string
	}{
		"no token":                 {pathURL + "hello", "", nil},
		"no token, by host":        {"http://" + host + "/hello", "", nil},
		"token of another port":    {pathURL + "hello", "", map[string]string{api.ServiceTokenHeader: x8081.Token}},
		"token of another sandbox": {pathURL + "hello", "", map[string]string{api.ServiceTokenHeader: x2.Token}},
		"token of another tenant":  {pathURL + "hello", "", map[string]string{api.ServiceTokenHeader: xO.Token}},
		"another tenant's API key": {pathURL + "hello", "", map[string]string{"Authorization": "Bearer " + otherKey.Key}},
		"expired token":            {pathURL + "hello", "", map[string]string{api.ServiceTokenHeader: xShort.Token}},
		"revoked token":            {pathURL + "hello", "", map[string]string{api.ServiceTokenHeader: xRevoked.Token}},
		"port 080":                 {prefix + "080/hello", "", tok},
		"port +8080":               {prefix + "+8080/hello", "", tok},
		"port 0x1f90":              {prefix + "0x1f90/hello", "", tok},
		"port %208080":             {prefix + "%208080/hello", "", tok},
		"port 8080%20":             {prefix + "8080%20/hello", "", tok},
		"host 08080":               {e.base + "/hello", "08080-" + sb.ID() + "." + e.domain, tok},
		"host +8080":               {e.base + "/hello", "+8080-" + sb.ID() + "." + e.domain, tok},
		"host 0x1f90":              {e.base + "/hello", "0x1f90-" + sb.ID() + "." + e.domain, tok},
		"port not exposed":         {prefix + "8082/hello", "", tok},
		"unknown sandbox":          {e.base + "/v1/sandboxes/zzzzzzzzzzzz/ports/8080/hello", "", tok},
	}
	var want *api.Error
	for name, c := range refusals {
		code, _, body := e.get(t, c.url, c.host, c.hdr)
		var ae api.Error
		if err := json.Unmarshal([]byte(body), &ae); err != nil || code != http.StatusNotFound || ae.RequestID == "" {
			t.Errorf("%s: %d %q, want the uniform 404", name, code, body)
			continue
		}
		ae.RequestID = ""
		if want == nil {
			want = &ae
		} else if ae != *want {
			t.Errorf("%s: refusal %+v differs from %+v", name, ae, *want)
		}
	}
	// The other tenant's own token works on its own sandbox's address
	// (nothing listens there: unavailable, not refused).
	if code, _, _ := e.get(t, e.base+xO.Path+"hello", "", map[string]string{api.ServiceTokenHeader: xO.Token}); code != http.StatusServiceUnavailable {
		t.Fatalf("the other tenant's token on its own sandbox with no service: %d, want 503", code)
	}

	// A browser link: exchanged for a cookie scoped to the host, then a
	// redirect without the parameter; the cookie gets through.
	code, hdr, _ := e.get(t, x.BrowserURL, "", nil)
	if code != http.StatusSeeOther || hdr.Get("Location") != "/" {
		t.Fatalf("browser link: %d to %q", code, hdr.Get("Location"))
	}
	cookie := strings.SplitN(hdr.Get("Set-Cookie"), ";", 2)[0]
	if !strings.HasPrefix(cookie, api.ServiceCookie+"=") || !strings.Contains(hdr.Get("Set-Cookie"), "HttpOnly") {
		t.Fatalf("cookie %q", hdr.Get("Set-Cookie"))
	}
	if code, _, body := e.get(t, "http://"+host+"/hello", "", map[string]string{"Cookie": cookie}); code != 200 || body != "hello from inside\n" {
		t.Fatalf("with the cookie: %d %q", code, body)
	}

	// Listed (without tokens), per sandbox and in all.
	l, err := sb.Exposures(ctx)
	if err != nil || len(l) != 2 || l[0].Token != "" {
		t.Fatalf("exposures of the sandbox: %+v, %v", l, err)
	}

	// A paused sandbox wakes on its first request.
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, body := e.get(t, pathURL+"hello", "", tok); code != 200 || body != "hello from inside\n" {
		t.Fatalf("request to the paused sandbox: %d %q", code, body)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info().State != api.StateRunning {
		t.Fatalf("after the request the sandbox is %q, %v", sb.Info().State, err)
	}

	// A hibernated one too: it starts again (its processes did not
	// survive hibernation, so nothing listens: 503, not the refusal).
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := e.get(t, pathURL+"hello", "", tok); code != http.StatusServiceUnavailable {
		t.Fatalf("request to the hibernated sandbox: %d, want 503 (woken, no server)", code)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info().State != api.StateRunning {
		t.Fatalf("after the request the hibernated sandbox is %q, %v", sb.Info().State, err)
	}
	startService(t, sb, 8080)

	// Tokens survive a daemon restart.
	e.d.restart(syscall.SIGTERM)
	if code, _, body := e.get(t, pathURL+"hello", "", tok); code != 200 || body != "hello from inside\n" {
		t.Fatalf("after a daemon restart: %d %q", code, body)
	}

	// Deleting the sandbox revokes its tokens.
	if err := sb2.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := acme.ListExposures(ctx); err != nil || len(l) != 2 {
		t.Fatalf("acme's exposures after deleting sb2: %+v, %v", l, err)
	}
	for _, ex := range mustList(t, acme) {
		if ex.Sandbox == sb2.ID() {
			t.Fatalf("exposure %s of the deleted sandbox is still listed", ex.ID)
		}
	}
}

func mustList(t *testing.T, c *agentbox.Client) []agentbox.Exposure {
	t.Helper()
	l, err := c.ListExposures(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The CLI: expose prints the URL and token, ls lists, rm revokes; a port
// is taken in its canonical spelling only.
func TestServiceURLsCLI(t *testing.T) {
	e := newSvcEnv(t)
	sb := e.d.create(t, agentbox.SandboxSpec{})
	startService(t, sb, 8080)
	out, errOut, code := e.d.cli(t, "--json", "expose", sb.ID(), "8080", "--ttl", "5m")
	if code != 0 {
		t.Fatalf("expose: %d %s", code, errOut)
	}
	var x api.Exposure
	if err := json.Unmarshal([]byte(out), &x); err != nil || x.Token == "" || x.Port != 8080 || time.Until(x.ExpiresAt) > 5*time.Minute {
		t.Fatalf("expose printed %q: %v", out, err)
	}
	if code, _, body := e.get(t, e.base+x.Path+"hello", "", map[string]string{api.ServiceTokenHeader: x.Token}); code != 200 || body != "hello from inside\n" {
		t.Fatalf("GET: %d %q", code, body)
	}
	out, _, code = e.d.cli(t, "expose", sb.ID(), "8080")
	if code != 0 || !strings.Contains(out, "TOKEN") || !strings.Contains(out, "BROWSER") {
		t.Fatalf("expose (text): %d %q", code, out)
	}
	for _, bad := range []string{"080", "+8080", "0x1f90", "65536", "0"} {
		if _, _, code := e.d.cli(t, "expose", sb.ID(), bad); code == 0 {
			t.Errorf("expose accepted port %q", bad)
		}
	}
	out, _, code = e.d.cli(t, "expose", "ls", sb.ID())
	if code != 0 || !strings.Contains(out, x.ID) || strings.Contains(out, x.Token) {
		t.Fatalf("expose ls: %d %q", code, out)
	}
	out, _, code = e.d.cli(t, "expose", "link", x.ID)
	if code != 0 || !strings.Contains(out, "?"+api.ServiceTokenParam+"=abl1.") {
		t.Fatalf("expose link: %d %q", code, out)
	}
	if _, errOut, code := e.d.cli(t, "expose", "rm", x.ID); code != 0 {
		t.Fatalf("expose rm: %d %s", code, errOut)
	}
	if code, _, _ := e.get(t, e.base+x.Path+"hello", "", map[string]string{api.ServiceTokenHeader: x.Token}); code != http.StatusNotFound {
		t.Fatalf("GET after expose rm: %d", code)
	}
}
