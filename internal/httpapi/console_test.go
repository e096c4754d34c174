package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/api"
)

var consoleStub = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = w.Write([]byte("console " + r.URL.Path))
})

// The console's files need no key (the login page is one of them), but
// the Host check still applies, and only GET/HEAD are served.
func TestConsoleServedWithoutKey(t *testing.T) {
	const key = "key-0123456789abcdef"
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}, Console: consoleStub})
	if rec := do(h, "GET", "/ui/app.js", ""); rec.Code != 200 || rec.Body.String() != "console /ui/app.js" {
		t.Fatalf("GET /ui/app.js: %d %q", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/ui", ""); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ui/" {
		t.Fatalf("GET /ui: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if rec := do(h, "POST", "/ui/", "x"); rec.Code != 400 {
		t.Fatalf("POST /ui/: %d", rec.Code)
	}
	req := httptest.NewRequest("GET", "/ui/", nil)
	req.Host = "rebound.evil.example"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 403 {
		t.Fatalf("GET /ui/ with a foreign Host: %d", rec.Code)
	}
	// The API beside it still needs the key.
	if rec := do(h, "GET", "/v1/sandboxes", ""); rec.Code != 401 {
		t.Fatalf("GET /v1/sandboxes without key: %d", rec.Code)
	}
	// Without a console, /ui/ is just another authenticated path.
	h, _ = newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}})
	if rec := do(h, "GET", "/ui/", ""); rec.Code != 401 {
		t.Fatalf("GET /ui/ without console: %d", rec.Code)
	}
}

// With the console, a request of the daemon's own origin is accepted (with
// a key); every other origin is refused as before.
func TestConsoleSameOrigin(t *testing.T) {
	const key = "key-0123456789abcdef"
	auth := []string{"Authorization", "Bearer " + key}
	for _, tc := range []struct {
		console bool
		origin  string
		hdr     []string
		status  int
	}{
		{true, "http://127.0.0.1:8080", auth, 200},
		{true, "http://127.0.0.1:8080", nil, 401},       // same origin still needs the key
		{false, "http://127.0.0.1:8080", auth, 403},     // no console: no browser callers
		{true, "https://127.0.0.1:8080", auth, 403},     // other scheme
		{true, "http://127.0.0.1:9090", auth, 403},      // other port
		{true, "http://evil.example", auth, 403},        // other host
		{true, "null", auth, 403},                       // opaque origin
		{true, "http://user@127.0.0.1:8080", auth, 403}, // not an origin
		{true, "http://127.0.0.1:8080/ui/", auth, 403},  // not an origin
		{true, "http://127.0.0.1:8080", append([]string{"Sec-Fetch-Site", "cross-site"}, auth...), 403},
	} {
		opts := Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{}}
		if tc.console {
			opts.Console = consoleStub
		}
		h, _ := newTestHandler(t, &fakeService{}, opts)
		req := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		req.Host = "127.0.0.1:8080"
		req.Header.Set("Origin", tc.origin)
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("console %v origin %q hdr %v: %d, want %d", tc.console, tc.origin, tc.hdr, rec.Code, tc.status)
		}
	}
}

func bearerProtocol(key string) string {
	return wsBearerPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// The terminal: a WebSocket whose key travels as a subprotocol (never
// echoed), keystrokes reach the process's stdin, resizes its terminal,
// output and the exit come back.
func TestTerminalWebSocket(t *testing.T) {
	const key = "key-0123456789abcdef"
	f := &fakeService{chunks: make(chan []byte, 16)}
	s := newFakeStream()
	s.events <- api.ExecEvent{Type: api.EventStarted, Pid: 9}
	s.events <- api.ExecEvent{Type: api.EventStdout, Data: []byte("$ ")}
	f.stream = s
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{}, Console: consoleStub})
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/sandboxes/sb1/terminal?rows=30&cols=120"

	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{TerminalProtocol, bearerProtocol(key)}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	defer conn.CloseNow()
	if got := conn.Subprotocol(); got != TerminalProtocol {
		t.Fatalf("subprotocol %q, want %q (the key must not be echoed)", got, TerminalProtocol)
	}
	if p := resp.Header.Get("Sec-WebSocket-Protocol"); strings.Contains(p, "bearer") {
		t.Fatalf("response echoes the key: %q", p)
	}
	typ, data, err := conn.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || string(data) != "$ " {
		t.Fatalf("first output: %v %q %v", typ, data, err)
	}
	f.mu.Lock()
	req := f.lastExec
	f.mu.Unlock()
	if req.TTY == nil || *req.TTY != (api.TTY{Rows: 30, Cols: 120}) || !req.StdinOpen || !slices.Equal(req.Cmd, []string{"/bin/sh"}) {
		t.Fatalf("exec request %+v", req)
	}
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-f.chunks:
		if string(got) != "ls\r" {
			t.Fatalf("stdin got %q", got)
		}
	case <-ctx.Done():
		t.Fatal("keystrokes never reached stdin")
	}
	ctl, _ := json.Marshal(map[string]any{"type": "resize", "rows": 40, "cols": 100})
	if err := conn.Write(ctx, websocket.MessageText, ctl); err != nil {
		t.Fatal(err)
	}
	for resized := false; !resized; {
		f.mu.Lock()
		resized = slices.Contains(f.calls, "Resize") && f.lastArgs[2] == api.TTY{Rows: 40, Cols: 100}
		f.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatal("the resize control never reached the process")
		}
		time.Sleep(5 * time.Millisecond)
	}
	code := 0
	s.events <- api.ExecEvent{Type: api.EventStdout, Data: []byte("done\n")}
	s.events <- api.ExecEvent{Type: api.EventExit, ExitCode: &code}
	if _, data, err := conn.Read(ctx); err != nil || string(data) != "done\n" {
		t.Fatalf("output: %q %v", data, err)
	}
	if typ, data, err := conn.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(data), `"exit"`) {
		t.Fatalf("exit: %v %q %v", typ, data, err)
	}
	if _, _, err := conn.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("close: %v", err)
	}
}

// Who may not open a terminal: no key, a wrong key, another origin, a
// read-only key (the route is a GET, but it runs a shell).
func TestTerminalRefused(t *testing.T) {
	const key = "key-0123456789abcdef"
	reg, _, read := newRegistry(t)
	f := &fakeService{}
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, APIKeys: []string{key}, Tenants: reg, AllowedHosts: []string{}, Console: consoleStub})
	srv := httptest.NewServer(h)
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/sandboxes/sb1/terminal"
	for _, tc := range []struct {
		name   string
		protos []string
		origin string
		status int
	}{
		{"no key", []string{TerminalProtocol}, "", 401},
		{"wrong key", []string{TerminalProtocol, bearerProtocol(key + "x")}, "", 401},
		{"malformed key", []string{TerminalProtocol, wsBearerPrefix + "!!"}, "", 401},
		{"cross origin", []string{TerminalProtocol, bearerProtocol(key)}, "http://evil.example", 403},
		{"read-only key", []string{TerminalProtocol, bearerProtocol(read.Key)}, "", 403},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		hdr := http.Header{}
		if tc.origin != "" {
			hdr.Set("Origin", tc.origin)
		}
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: tc.protos, HTTPHeader: hdr})
		cancel()
		if err == nil {
			conn.CloseNow()
			t.Errorf("%s: connected", tc.name)
			continue
		}
		if resp == nil || resp.StatusCode != tc.status {
			t.Errorf("%s: %v, want %d", tc.name, resp, tc.status)
		}
	}
	f.mu.Lock()
	ran := slices.Contains(f.calls, "Exec")
	f.mu.Unlock()
	if ran {
		t.Error("a refused terminal ran a process")
	}
	// A plain GET (no upgrade) is 400 and runs nothing.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/sb1/terminal", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("GET without upgrade: %d", resp.StatusCode)
	}
}

func FuzzWSBearer(f *testing.F) {
	f.Add("agentbox.terminal.v1, agentbox.bearer.a2V5")
	f.Add("agentbox.bearer.")
	f.Add("agentbox.bearer.!!, x")
	f.Fuzz(func(t *testing.T, protos string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Protocol", protos)
		key, ok := wsBearer(r)
		if ok && key == "" {
			t.Fatal("empty key accepted")
		}
		if ok && !strings.Contains(protos, wsBearerPrefix+base64.RawURLEncoding.EncodeToString([]byte(key))) {
			t.Fatalf("key %q not from %q", key, protos)
		}
	})
}
