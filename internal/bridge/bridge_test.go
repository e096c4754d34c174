package bridge

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/secrets"
)

// authz is the Manager's check minus the sandbox table: verify, same
// sandbox, run live.
type authz struct {
	tokens *secrets.Tokens
	mu     sync.Mutex
	live   map[string]bool
}

func (a *authz) AuthorizeRun(ctx context.Context, sandboxID, tok string) (secrets.RunClaims, error) {
	c, err := a.tokens.Verify(tok)
	if err != nil {
		return c, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.Sandbox != sandboxID || !a.live[c.Run] {
		return secrets.RunClaims{}, fmt.Errorf("denied: %w", errdefs.ErrUnauthenticated)
	}
	return c, nil
}

type secretMap map[string][]byte

func (s secretMap) Secret(ctx context.Context, name string) ([]byte, error) {
	if v, ok := s[name]; ok {
		return v, nil
	}
	return nil, fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
}

type sink struct {
	mu  sync.Mutex
	evs []api.SandboxEvent
}

func (s *sink) RecordEvent(ctx context.Context, ev api.SandboxEvent) error {
	if ev.Type != "log" && ev.Type != "metric" && ev.Type != "usage" {
		return fmt.Errorf("bad type: %w", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	s.evs = append(s.evs, ev)
	s.mu.Unlock()
	return nil
}

const cred = "upstream-credential-7f3a9c"

type fixture struct {
	br       *Bridge
	tokens   *secrets.Tokens
	auth     *authz
	sink     *sink
	upstream *httptest.Server
	mu       sync.Mutex
	seen     []http.Header
	paths    []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{sink: &sink{}}
	f.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Header.Clone())
		f.paths = append(f.paths, r.URL.RequestURI())
		f.mu.Unlock()
		// A careless upstream echoing the credential back.
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "hello %s; you sent %q", r.URL.Path, r.Header.Get("Authorization"))
	}))
	t.Cleanup(f.upstream.Close)
	kb := make([]byte, secrets.KeySize)
	_, _ = rand.Read(kb)
	key, _ := secrets.KeyFromBytes(kb)
	f.tokens = secrets.NewTokens(key)
	f.auth = &authz{tokens: f.tokens, live: map[string]bool{}}
	br, err := New(Config{Connectors: []Connector{{Name: "gh", URL: f.upstream.URL + "/api", Secret: "github"}, {Name: "root", URL: f.upstream.URL, Secret: "github"}}},
		f.auth, secretMap{"github": []byte(cred)}, f.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	f.br = br
	return f
}

func (f *fixture) mint(t *testing.T, sandbox, run string, exp time.Duration) string {
	t.Helper()
	tok, err := f.tokens.Mint(secrets.RunClaims{Tenant: "admin", Sandbox: sandbox, Run: run, Boot: "b",
		RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(exp))}})
	if err != nil {
		t.Fatal(err)
	}
	f.auth.mu.Lock()
	f.auth.live[run] = true
	f.auth.mu.Unlock()
	return tok
}

// do sends one request over a pipe handed to ServeConn as sandbox sb.
func (f *fixture) do(t *testing.T, sb string, req *http.Request) (*http.Response, string) {
	t.Helper()
	client, server := net.Pipe()
	go f.br.ServeConn(context.Background(), sb, server)
	defer client.Close()
	if err := req.Write(client); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(client), req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func newReq(method, path, tok, body string) *http.Request {
	req, _ := http.NewRequest(method, "http://"+api.BridgeAddr+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req
}

func TestForwardAttachesCredentialAndRedactsEcho(t *testing.T) {
	f := newFixture(t)
	tok := f.mint(t, "sbA", "run1", time.Minute)
	req := newReq("POST", "/v1/connectors/gh/repos/x?per_page=2", tok, "{}")
	req.Header.Set("Cookie", "c=1")
	req.Header.Set("X-Forwarded-For", "1.2.3.4")
	resp, body := f.do(t, "sbA", req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	f.mu.Lock()
	got, path := f.seen[0], f.paths[0]
	f.mu.Unlock()
	if got.Get("Authorization") != "Bearer "+cred {
		t.Fatalf("upstream got Authorization %q", got.Get("Authorization"))
	}
	if strings.Contains(got.Get("Authorization"), tok) || got.Get("Cookie") != "" || got.Get("X-Forwarded-For") != "" {
		t.Fatalf("sandbox headers leaked upstream: %v", got)
	}
	if path != "/api/repos/x?per_page=2" {
		t.Fatalf("upstream path %q", path)
	}
	// A base URL without a path still yields an absolute request path.
	if resp, body := f.do(t, "sbA", newReq("POST", "/v1/connectors/root/hello", tok, "")); resp.StatusCode != 200 {
		t.Fatalf("root connector: %d %s", resp.StatusCode, body)
	}
	f.mu.Lock()
	path = f.paths[len(f.paths)-1]
	f.mu.Unlock()
	if path != "/hello" {
		t.Fatalf("root connector path %q", path)
	}
	// The connector gets the canonical path, decoded once: a double-encoded
	// dot segment stays a literal one, an encoded unreserved character is
	// decoded.
	if resp, body := f.do(t, "sbA", newReq("POST", "/v1/connectors/gh/%252e%252e/x%41", tok, "")); resp.StatusCode != 200 {
		t.Fatalf("double-encoded path: %d %s", resp.StatusCode, body)
	}
	f.mu.Lock()
	path = f.paths[len(f.paths)-1]
	f.mu.Unlock()
	if path != "/api/%252e%252e/xA" {
		t.Fatalf("double-encoded path reached the connector as %q", path)
	}
	if strings.Contains(body, cred) || strings.Contains(resp.Header.Get("X-Echo"), cred) {
		t.Fatalf("credential echoed into the sandbox: %q / %q", body, resp.Header.Get("X-Echo"))
	}
	if !strings.Contains(body, "[REDACTED:github]") {
		t.Fatalf("body %q", body)
	}
}

func TestRejections(t *testing.T) {
	f := newFixture(t)
	tokA := f.mint(t, "sbA", "runA", time.Minute)
	expired := f.mint(t, "sbA", "runOld", -time.Second)
	ended := f.mint(t, "sbA", "runEnded", time.Minute)
	f.auth.mu.Lock()
	delete(f.auth.live, "runEnded")
	f.auth.mu.Unlock()
	cases := []struct {
		name, sb, tok, path string
		status              int
	}{
		{"no token", "sbA", "", "/v1/connectors/gh/x", 401},
		{"other sandbox", "sbB", tokA, "/v1/connectors/gh/x", 401},
		{"expired", "sbA", expired, "/v1/connectors/gh/x", 401},
		{"run ended", "sbA", ended, "/v1/connectors/gh/x", 401},
		{"alg none", "sbA", "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + strings.Split(tokA, ".")[1] + ".", "/v1/connectors/gh/x", 401},
		{"unknown connector", "sbA", tokA, "/v1/connectors/nope/x", 404},
		{"dot-dot", "sbA", tokA, "/v1/connectors/gh/../../admin", 400},
		{"encoded dot-dot", "sbA", tokA, "/v1/connectors/gh/%2e%2e/admin", 400},
		{"encoded slash", "sbA", tokA, "/v1/connectors/gh/a%2f..%2fadmin", 400},
		{"backslash", "sbA", tokA, "/v1/connectors/gh/a%5c..%5cadmin", 400},
		{"empty segment", "sbA", tokA, "/v1/connectors/gh//admin", 400},
		{"dot-dot with parameters", "sbA", tokA, "/v1/connectors/gh/..;/admin", 400},
		{"unknown route", "sbA", tokA, "/v1/other", 404},
	}
	for _, c := range cases {
		resp, body := f.do(t, c.sb, newReq("POST", c.path, c.tok, ""))
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d (%s)", c.name, resp.StatusCode, c.status, body)
		}
	}
	f.mu.Lock()
	n := len(f.seen)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d rejected requests reached the upstream", n)
	}
}

// Served on an ordinary listener (not a tunnel), even a valid token is
// refused: there is no sandbox identity to bind it to.
func TestNotThroughTunnel(t *testing.T) {
	f := newFixture(t)
	tok := f.mint(t, "sbA", "run1", time.Minute)
	srv := httptest.NewServer(f.br)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/connectors/gh/x", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
}

func TestEvents(t *testing.T) {
	f := newFixture(t)
	tok := f.mint(t, "sbA", "run1", time.Minute)
	resp, body := f.do(t, "sbA", newReq("POST", "/v1/events", tok, `{"type":"metric","name":"tokens","value":42,"attrs":{"model":"m"}}`))
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, bad := range []string{`{"type":"evil"}`, `{"type":"log","sandbox_id":"sbB"}`, `not json`} {
		if resp, body := f.do(t, "sbA", newReq("POST", "/v1/events", tok, bad)); resp.StatusCode != 400 {
			t.Errorf("%s: status %d (%s)", bad, resp.StatusCode, body)
		}
	}
	f.sink.mu.Lock()
	defer f.sink.mu.Unlock()
	if len(f.sink.evs) != 1 {
		t.Fatalf("events %+v", f.sink.evs)
	}
	ev := f.sink.evs[0]
	if ev.SandboxID != "sbA" || ev.RunID != "run1" || ev.Name != "tokens" || ev.Value != 42 || ev.Attrs["model"] != "m" {
		t.Fatalf("event %+v", ev)
	}
}

func TestValidConnector(t *testing.T) {
	good := Connector{Name: "gh", URL: "https://api.github.com", Secret: "github"}
	if err := ValidConnector(good); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Connector{
		{Name: "gh", URL: "ftp://x", Secret: "s"},
		{Name: "gh", URL: "https://user:pw@x", Secret: "s"},
		{Name: "gh", URL: "https://x", Secret: "bad name"},
		{Name: "../x", URL: "https://x", Secret: "s"},
		{Name: "gh", URL: "https://x", Secret: "s", Format: "no placeholder"},
		{Name: "gh", URL: "https://x", Secret: "s", Header: "Bad: header"},
	} {
		if err := ValidConnector(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestLoadConnectors(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := dir + "/c.json"
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cs, err := LoadConnectors(write(`[{"name":"gh","url":"https://api.github.com","secret":"github","format":"token {secret}"}]`))
	if err != nil || len(cs) != 1 || cs[0].Format != "token {secret}" {
		t.Fatalf("LoadConnectors = %+v, %v", cs, err)
	}
	if _, err := LoadConnectors(write(`[{"name":"gh","url":"https://x","secret":"s","typo":1}]`)); err == nil {
		t.Fatal("unknown field accepted")
	}
	if cs, err := LoadConnectors(""); err != nil || cs != nil {
		t.Fatalf("no file: %v %v", cs, err)
	}
}
