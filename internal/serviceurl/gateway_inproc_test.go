package serviceurl_test

// The feature on a real Manager and real guests (sandboxtest, the
// in-process backend, whose guest dials the host's loopback: a server
// started here is "inside" every sandbox): who gets through the gateway,
// and what everybody else sees.

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/serviceurl"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type env struct {
	*sandboxtest.Env
	x     *serviceurl.Exposures
	clk   *clock
	gw    *httptest.Server
	port  int // the service "inside"
	port2 int // another service, never exposed
}

const domain = "sb.test"

func newEnv(t *testing.T) *env { t.Helper(); return newEnvDomain(t, domain) }

// newEnvDomain is newEnv with the service domain dom ("": path-based only).
func newEnvDomain(t *testing.T, dom string) *env {
	t.Helper()
	signer, err := serviceurl.NewSigner(bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{clk: &clock{now: time.Now()}}
	e.Env = sandboxtest.New(t, func(se *sandboxtest.Env, c *sandbox.Config) {
		x, err := serviceurl.New(context.Background(), serviceurl.Config{Store: se.Store, Signer: signer, Domain: dom, PublicURL: "http://gw.test", Logger: slog.New(slog.DiscardHandler), Now: e.clk.Now,
			Reserved: func(p int) bool { return p == 3129 }})
		if err != nil {
			t.Fatal(err)
		}
		e.x = x
		c.Extensions = []sandbox.Extension{x}
	})
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Host", r.Host)
		w.Header().Set("X-Seen-Token", r.Header.Get(api.ServiceTokenHeader)+r.Header.Get("Authorization"))
		w.Header().Set("X-Seen-Cookie", r.Header.Get("Cookie"))
		w.Header().Set("X-Seen-Prefix", r.Header.Get("X-Forwarded-Prefix"))
		_, _ = io.WriteString(w, "path="+r.URL.Path+" query="+r.URL.RawQuery)
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			_, _ = io.WriteString(w, "tick"+strconv.Itoa(i)+"\n")
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	})
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	svc := httptest.NewServer(mux)
	t.Cleanup(svc.Close)
	e.port = svc.Listener.Addr().(*net.TCPAddr).Port
	other := httptest.NewServer(mux)
	t.Cleanup(other.Close)
	e.port2 = other.Listener.Addr().(*net.TCPAddr).Port
	e.gw = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.x.Match(r) {
			http.Error(w, "api", http.StatusTeapot)
			return
		}
		if err := e.x.ServeService(w, r, nil); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
		}
	}))
	t.Cleanup(e.gw.Close)
	return e
}

// get sends a request to the gateway with Host host (path-based when "").
func (e *env) get(t *testing.T, host, path string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", e.gw.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func asTenant(ctx context.Context, tn string) context.Context {
	return tenant.WithPrincipal(ctx, tenant.Principal{Tenant: tn, Scope: api.ScopeFull})
}

func TestGatewayAdmitsTheTokenAndNothingElse(t *testing.T) {
	e := newEnv(t)
	ctx := sandboxtest.Context(t)
	sb := e.Create(api.CreateSandboxRequest{})
	sb2 := e.Create(api.CreateSandboxRequest{})
	x, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port, TTLSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if x.Token == "" || x.URL != "http://"+strconv.Itoa(e.port)+"-"+sb.ID+"."+domain+"/" || !strings.HasPrefix(x.BrowserURL, x.URL+"?"+api.ServiceTokenParam+"=") {
		t.Fatalf("exposure %+v", x)
	}
	path := x.Path + "echo?a=1"

	// Header, bearer: through, with the credential taken off.
	for _, hdr := range []map[string]string{{api.ServiceTokenHeader: x.Token}, {"Authorization": "Bearer " + x.Token}} {
		r := e.get(t, "", path, hdr)
		if b := body(t, r); r.StatusCode != 200 || b != "path=/echo query=a=1" {
			t.Fatalf("%v: %d %q", hdr, r.StatusCode, b)
		}
		if r.Header.Get("X-Seen-Token") != "" || r.Header.Get("X-Seen-Prefix") != strings.TrimSuffix(x.Path, "/") {
			t.Fatalf("the service saw token %q, prefix %q", r.Header.Get("X-Seen-Token"), r.Header.Get("X-Seen-Prefix"))
		}
	}
	// Host-based: the same token.
	host := serviceurl.HostOf(serviceurl.Target{Sandbox: sb.ID, Port: e.port}, domain)
	r := e.get(t, host, "/echo", map[string]string{api.ServiceTokenHeader: x.Token})
	if b := body(t, r); r.StatusCode != 200 || b != "path=/echo query=" || r.Header.Get("X-Seen-Host") != host {
		t.Fatalf("host-based: %d %q host %q", r.StatusCode, b, r.Header.Get("X-Seen-Host"))
	}
	// A service's own bearer credential passes through.
	r = e.get(t, host, "/echo", map[string]string{api.ServiceTokenHeader: x.Token, "Authorization": "Bearer app-own"})
	if r.Header.Get("X-Seen-Token") != "Bearer app-own" {
		t.Fatalf("the service's own Authorization was %q", r.Header.Get("X-Seen-Token"))
	}

	// The refusals: one status, one body, whatever the reason.
	x2, err := e.x.Expose(ctx, sb2.ID, api.ExposeRequest{Port: e.port2})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		host, path string
		hdr        map[string]string
	}{
		"no token":              {"", path, nil},
		"garbage token":         {"", path, map[string]string{api.ServiceTokenHeader: "abt1.nope"}},
		"token of another port": {"", strings.Replace(path, "/ports/"+strconv.Itoa(e.port)+"/", "/ports/"+strconv.Itoa(e.port2)+"/", 1), map[string]string{api.ServiceTokenHeader: x.Token}},
		"token of another sandbox": {"", strings.Replace(x2.Path, strconv.Itoa(e.port2), strconv.Itoa(e.port), 1) + "echo",
			map[string]string{api.ServiceTokenHeader: x.Token}},
		"another sandbox's token":       {"", path, map[string]string{api.ServiceTokenHeader: x2.Token}},
		"port 0" + strconv.Itoa(e.port): {"", strings.Replace(path, "/ports/", "/ports/0", 1), map[string]string{api.ServiceTokenHeader: x.Token}},
		"port +":                        {"", strings.Replace(path, "/ports/", "/ports/+", 1), map[string]string{api.ServiceTokenHeader: x.Token}},
		"port hex":                      {"", strings.Replace(path, "/ports/"+strconv.Itoa(e.port), "/ports/0x"+strconv.FormatInt(int64(e.port), 16), 1), map[string]string{api.ServiceTokenHeader: x.Token}},
		"host port 0":                   {"0" + host, "/echo", map[string]string{api.ServiceTokenHeader: x.Token}},
		"link as a header":              {"", path, map[string]string{api.ServiceTokenHeader: mustQuery(t, x.BrowserURL)}},
	}
	var first string
	for name, c := range cases {
		r := e.get(t, c.host, c.path, c.hdr)
		b := body(t, r)
		if r.StatusCode != 404 {
			t.Errorf("%s: %d %q, want the refusal", name, r.StatusCode, b)
		}
		if first == "" {
			first = b
		} else if b != first {
			t.Errorf("%s: refusal %q differs from %q", name, b, first)
		}
	}

	// Another tenant cannot see, list or revoke the exposure.
	if l, err := e.x.ListExposures(asTenant(ctx, "other"), ""); err != nil || len(l) != 0 {
		t.Fatalf("another tenant lists %+v, %v", l, err)
	}
	if err := e.x.RevokeExposure(asTenant(ctx, "other"), x.ID); err == nil {
		t.Fatal("another tenant revoked the exposure")
	}
	if _, err := e.x.Expose(asTenant(ctx, "other"), sb.ID, api.ExposeRequest{Port: 80}); err == nil {
		t.Fatal("another tenant exposed a port of the admin's sandbox")
	}
	if _, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: 3129}); err == nil {
		t.Fatal("a platform port was exposed")
	}
	if l, err := e.x.ListExposures(ctx, sb.ID); err != nil || len(l) != 1 || l[0].Token != "" || l[0].ID != x.ID {
		t.Fatalf("list %+v, %v", l, err)
	}

	// Revoked: refused at once.
	if err := e.x.RevokeExposure(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	if r := e.get(t, "", path, map[string]string{api.ServiceTokenHeader: x.Token}); r.StatusCode != 404 || body(t, r) != first {
		t.Fatalf("revoked token: %d", r.StatusCode)
	}
	// Expired: refused.
	x3, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if r := e.get(t, "", path, map[string]string{api.ServiceTokenHeader: x3.Token}); r.StatusCode != 200 {
		t.Fatalf("fresh token: %d", r.StatusCode)
	}
	e.clk.add(61 * time.Second)
	if r := e.get(t, "", path, map[string]string{api.ServiceTokenHeader: x3.Token}); r.StatusCode != 404 || body(t, r) != first {
		t.Fatalf("expired token: %d", r.StatusCode)
	}
	// Deleting the sandbox revokes its tokens.
	if r := e.get(t, "", x2.Path+"echo", map[string]string{api.ServiceTokenHeader: x2.Token}); r.StatusCode != 200 {
		t.Fatalf("second sandbox's token: %d", r.StatusCode)
	}
	if err := e.M.DeleteSandbox(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	if l, _ := e.x.ListExposures(ctx, ""); len(l) != 0 {
		t.Fatalf("exposures left after the deletes: %+v", l)
	}
	if r := e.get(t, "", x2.Path+"echo", map[string]string{api.ServiceTokenHeader: x2.Token}); r.StatusCode != 404 {
		t.Fatalf("token of a deleted sandbox: %d", r.StatusCode)
	}
}

func mustQuery(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.Query().Get(api.ServiceTokenParam)
}

// A browser link: the parameter is exchanged for a cookie on that host and
// a redirect to the address without it; the cookie then gets through.
func TestGatewayBrowserLink(t *testing.T) {
	e := newEnv(t)
	ctx := sandboxtest.Context(t)
	sb := e.Create(api.CreateSandboxRequest{})
	x, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port})
	if err != nil {
		t.Fatal(err)
	}
	host := serviceurl.HostOf(serviceurl.Target{Sandbox: sb.ID, Port: e.port}, domain)
	link := mustQuery(t, x.BrowserURL)
	r := e.get(t, host, "/echo?keep=1&"+api.ServiceTokenParam+"="+url.QueryEscape(link), nil)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/echo?keep=1" {
		t.Fatalf("link: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
	cookies := r.Cookies()
	if len(cookies) != 1 || cookies[0].Name != api.ServiceCookie || !cookies[0].HttpOnly || cookies[0].Domain != "" || cookies[0].Path != "/" {
		t.Fatalf("cookie %+v", cookies)
	}
	r = e.get(t, host, "/echo?keep=1", map[string]string{"Cookie": api.ServiceCookie + "=" + cookies[0].Value + "; app=1"})
	if b := body(t, r); r.StatusCode != 200 || b != "path=/echo query=keep=1" || r.Header.Get("X-Seen-Cookie") != "app=1" {
		t.Fatalf("with the cookie: %d %q, the service saw cookies %q", r.StatusCode, b, r.Header.Get("X-Seen-Cookie"))
	}
	// Path-based addresses share the daemon's origin: with a service
	// domain, neither the link nor the cookie is taken there (a page of
	// another service could use them); the header still is.
	r = e.get(t, "", x.Path+"echo?"+api.ServiceTokenParam+"="+url.QueryEscape(link), nil)
	if r.StatusCode != http.StatusNotFound || len(r.Cookies()) != 0 {
		t.Fatalf("path-based link with a service domain: %d %+v", r.StatusCode, r.Cookies())
	}
	r = e.get(t, "", x.Path+"echo", map[string]string{"Cookie": api.ServiceCookie + "=" + cookies[0].Value})
	if r.StatusCode != http.StatusNotFound {
		t.Fatalf("path-based cookie with a service domain: %d", r.StatusCode)
	}
	if r := e.get(t, "", x.Path+"echo", map[string]string{api.ServiceTokenHeader: x.Token}); r.StatusCode != 200 {
		t.Fatalf("path-based header: %d", r.StatusCode)
	}
	// An expired link is refused; a fresh one is minted for the owner
	// only, without the token.
	e.clk.add(api.ServiceLinkTTL + time.Second)
	if r := e.get(t, host, "/echo?"+api.ServiceTokenParam+"="+url.QueryEscape(link), nil); r.StatusCode != 404 {
		t.Fatalf("expired link: %d", r.StatusCode)
	}
	if _, err := e.x.ExposureLink(asTenant(ctx, "other"), x.ID); err == nil {
		t.Fatal("another tenant got a link")
	}
	fresh, err := e.x.ExposureLink(ctx, x.ID)
	if err != nil || fresh.Token != "" || fresh.BrowserURL == x.BrowserURL {
		t.Fatalf("fresh link %+v, %v", fresh, err)
	}
	if r := e.get(t, host, "/echo?"+api.ServiceTokenParam+"="+url.QueryEscape(mustQuery(t, fresh.BrowserURL)), nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("fresh link: %d", r.StatusCode)
	}
}

// Streamed responses arrive as they are written; a WebSocket echoes; a
// paused sandbox wakes for a request.
func TestGatewayStreamsWebSocketsAndWakes(t *testing.T) {
	e := newEnv(t)
	ctx := sandboxtest.Context(t)
	sb := e.Create(api.CreateSandboxRequest{})
	x, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port})
	if err != nil {
		t.Fatal(err)
	}
	r := e.get(t, "", x.Path+"stream", map[string]string{api.ServiceTokenHeader: x.Token})
	buf := make([]byte, 64)
	start := time.Now()
	n, err := r.Body.Read(buf)
	if err != nil || string(buf[:n]) != "tick0\n" || time.Since(start) > 90*time.Millisecond {
		t.Fatalf("first chunk %q %v after %v: not streamed", buf[:n], err, time.Since(start))
	}

	cfg, err := websocket.NewConfig(strings.Replace(e.gw.URL, "http", "ws", 1)+x.Path+"ws", "http://gw.test")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header.Set(api.ServiceTokenHeader, x.Token)
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, m := range []string{"hello", "through the guest"} {
		if err := websocket.Message.Send(ws, m); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != m {
			t.Fatalf("echo %q %v, want %q", got, err, m)
		}
	}
	ws.Close()

	if _, err := e.M.SetState(ctx, sb.ID, api.StatePaused); err != nil {
		t.Fatal(err)
	}
	r = e.get(t, "", x.Path+"echo", map[string]string{api.ServiceTokenHeader: x.Token})
	if r.StatusCode != 200 {
		t.Fatalf("request to a paused sandbox: %d", r.StatusCode)
	}
	got, err := e.M.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after the request the sandbox is %q, %v", got.State, err)
	}
}

// Exposures outlive a restart (they are stored), and those of sandboxes
// that are gone are forgotten by Reconcile.
func TestExposuresSurviveRestartAndReconcile(t *testing.T) {
	e := newEnv(t)
	ctx := sandboxtest.Context(t)
	sb := e.Create(api.CreateSandboxRequest{})
	x, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port})
	if err != nil {
		t.Fatal(err)
	}
	stale := store.ExposureRecord{ID: serviceurl.NewExposureID(), Sandbox: "zzzzzzzzzzzz", Port: 80, Tenant: "admin", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	expired := store.ExposureRecord{ID: serviceurl.NewExposureID(), Sandbox: sb.ID, Port: 81, Tenant: "admin", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(-time.Second)}
	for _, r := range []store.ExposureRecord{stale, expired} {
		if err := e.Store.PutExposure(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	signer, _ := serviceurl.NewSigner(bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32))
	x2, err := serviceurl.New(ctx, serviceurl.Config{Store: e.Store, Signer: signer, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := x2.Provision(e.M); err != nil {
		t.Fatal(err)
	}
	if err := x2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	recs, err := e.Store.ListExposures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != x.ID {
		t.Fatalf("stored after the restart: %+v, want only %s", recs, x.ID)
	}
	l, err := x2.ListExposures(ctx, "")
	if err != nil || len(l) != 1 || l[0].ID != x.ID {
		t.Fatalf("listed after the restart: %+v, %v", l, err)
	}
}

// Without a service domain the path-based address is the browser's too:
// the link becomes a cookie scoped to the service's path.
func TestGatewayBrowserLinkPathBased(t *testing.T) {
	e := newEnvDomain(t, "")
	ctx := sandboxtest.Context(t)
	sb := e.Create(api.CreateSandboxRequest{})
	x, err := e.x.Expose(ctx, sb.ID, api.ExposeRequest{Port: e.port})
	if err != nil {
		t.Fatal(err)
	}
	if x.URL != "http://gw.test"+x.Path {
		t.Fatalf("URL %q", x.URL)
	}
	r := e.get(t, "", x.Path+"echo?"+api.ServiceTokenParam+"="+url.QueryEscape(mustQuery(t, x.BrowserURL)), nil)
	c := r.Cookies()
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != x.Path+"echo" || len(c) != 1 || c[0].Path != x.Path {
		t.Fatalf("path-based link: %d to %q, cookies %+v", r.StatusCode, r.Header.Get("Location"), c)
	}
	r = e.get(t, "", x.Path+"echo", map[string]string{"Cookie": api.ServiceCookie + "=" + c[0].Value})
	if b := body(t, r); r.StatusCode != 200 || b != "path=/echo query=" {
		t.Fatalf("with the cookie: %d %q", r.StatusCode, b)
	}
}
