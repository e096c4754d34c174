package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// syncBuffer is a log sink safe for concurrent handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestHandler(t testing.TB, svc Service, opts Options) (http.Handler, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Version == "" {
		opts.Version = "1.2.3"
	}
	if opts.RequireAuth && opts.AllowedHosts == nil {
		// httptest requests carry Host example.com, which the default
		// (IP literals and localhost) refuses; TestHostAndOrigin covers
		// the default.
		opts.AllowedHosts = []string{"example.com", "127.0.0.1"}
	}
	return New(svc, opts), logs
}

func do(h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func decodeError(t *testing.T, rec *httptest.ResponseRecorder) api.Error {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q, body %q", ct, rec.Body.String())
	}
	var e api.Error
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("decoding error body: %v", err)
	}
	if e.RequestID == "" || e.RequestID != rec.Header().Get(api.RequestIDHeader) {
		t.Fatalf("request id %q vs header %q", e.RequestID, rec.Header().Get(api.RequestIDHeader))
	}
	return e
}

func TestHappyPaths(t *testing.T) {
	cases := []struct {
		method, target, body string
		status               int
		call                 string
		wantArgs             []any
		check                func(t *testing.T, rec *httptest.ResponseRecorder)
	}{
		{"GET", "/v1/health", "", 200, "", nil, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if strings.TrimSpace(rec.Body.String()) != `{"status":"ok"}` {
				t.Fatalf("health body %q", rec.Body.String())
			}
		}},
		{"GET", "/v1/info", "", 200, "Info", nil, nil},
		{"GET", "/v1/openapi.yaml", "", 200, "", nil, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if rec.Header().Get("Content-Type") != "application/yaml" || !bytes.Equal(rec.Body.Bytes(), api.OpenAPI) {
				t.Fatal("openapi not served")
			}
		}},
		{"POST", "/v1/sandboxes", `{"template":"busybox","labels":{"a":"b"},"resources":{"cpus":0.5}}`, 201, "CreateSandbox",
			[]any{api.CreateSandboxRequest{Template: "busybox", Labels: map[string]string{"a": "b"}, Resources: api.Resources{CPUs: 0.5}}}, func(t *testing.T, rec *httptest.ResponseRecorder) {
				if rec.Header().Get("Location") != "/v1/sandboxes/sb-new" {
					t.Fatalf("Location %q", rec.Header().Get("Location"))
				}
			}},
		{"POST", "/v1/sandboxes", "", 201, "CreateSandbox", []any{api.CreateSandboxRequest{}}, nil},
		{"GET", "/v1/sandboxes?label=a=b&label=c=d=e", "", 200, "ListSandboxes", []any{map[string]string{"a": "b", "c": "d=e"}}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			var l api.SandboxList
			if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || len(l.Sandboxes) != 2 {
				t.Fatalf("list: %v %s", err, rec.Body)
			}
		}},
		{"GET", "/v1/sandboxes/abc-1", "", 200, "GetSandbox", []any{"abc-1"}, nil},
		{"DELETE", "/v1/sandboxes/abc-1", "", 204, "DeleteSandbox", []any{"abc-1"}, nil},
		{"POST", "/v1/sandboxes/abc/exec", `{"cmd":["echo","hi"]}`, 200, "Exec", []any{"abc"}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if rec.Header().Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("content type %q", rec.Header().Get("Content-Type"))
			}
			evs := readEvents(t, rec.Body)
			if len(evs) != 3 || evs[0].Type != "started" || string(evs[1].Data) != "hi\n" || evs[2].Type != "exit" || *evs[2].ExitCode != 0 {
				t.Fatalf("events %+v", evs)
			}
		}},
		{"POST", "/v1/sandboxes/abc/exec", `{"command":"sleep 9","background":true}`, 201, "StartProcess", []any{"abc"}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			var p api.Process
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Pid != 9 {
				t.Fatalf("process %v %s", err, rec.Body)
			}
		}},
		{"GET", "/v1/sandboxes/abc/processes", "", 200, "ListProcesses", []any{"abc"}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if strings.TrimSpace(rec.Body.String()) != `{"processes":[]}` {
				t.Fatalf("nil list must encode as []: %s", rec.Body)
			}
		}},
		{"GET", "/v1/sandboxes/abc/processes/7/attach?replay=true", "", 200, "Attach", []any{"abc", 7, true}, nil},
		{"POST", "/v1/sandboxes/abc/processes/7/stdin?close=true", "input", 204, "WriteStdin", []any{"abc", 7, true}, nil},
		{"POST", "/v1/sandboxes/abc/processes/7/signal", `{"signal":"TERM"}`, 204, "Signal", []any{"abc", 7, "TERM"}, nil},
		{"POST", "/v1/sandboxes/abc/processes/7/resize", `{"rows":24,"cols":80}`, 204, "Resize", []any{"abc", 7, api.TTY{Rows: 24, Cols: 80}}, nil},
		{"GET", "/v1/sandboxes/abc/files?path=/etc/motd", "", 200, "ReadFile", []any{"abc", "/etc/motd"}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if rec.Body.String() != "hello" || rec.Header().Get("Content-Length") != "5" || rec.Header().Get("X-Agentbox-Mode") != "0640" {
				t.Fatalf("file: %q %v", rec.Body, rec.Header())
			}
		}},
		{"PUT", "/v1/sandboxes/abc/files?path=/a/b&mode=0755&parents=true", "data", 200, "WriteFile", []any{"abc", "/a/b", uint32(0o755), true}, nil},
		{"PUT", "/v1/sandboxes/abc/files?path=/a/b", "data", 200, "WriteFile", []any{"abc", "/a/b", uint32(0o644), false}, nil},
		{"GET", "/v1/sandboxes/abc/fs/stat?path=/a", "", 200, "Stat", []any{"abc", "/a"}, nil},
		{"GET", "/v1/sandboxes/abc/fs/list?path=/a", "", 200, "List", []any{"abc", "/a"}, nil},
		{"POST", "/v1/sandboxes/abc/fs/mkdir", `{"path":"/d","parents":true}`, 201, "Mkdir", []any{"abc", api.MkdirRequest{Path: "/d", Parents: true}}, nil},
		{"POST", "/v1/sandboxes/abc/fs/move", `{"from":"/a","to":"/b"}`, 204, "Move", []any{"abc", api.MoveRequest{From: "/a", To: "/b"}}, nil},
		{"DELETE", "/v1/sandboxes/abc/fs?path=/a&recursive=true", "", 204, "Remove", []any{"abc", "/a", true}, nil},
		{"GET", "/v1/sandboxes/abc/fs/archive?path=/a", "", 200, "ReadArchive", []any{"abc", "/a"}, func(t *testing.T, rec *httptest.ResponseRecorder) {
			if rec.Header().Get("Content-Type") != "application/x-tar" || rec.Body.String() != "tar-bytes" {
				t.Fatalf("archive: %v %q", rec.Header(), rec.Body)
			}
		}},
		{"PUT", "/v1/sandboxes/abc/fs/archive?path=/a", "tar", 204, "WriteArchive", []any{"abc", "/a"}, nil},
		{"GET", "/v1/templates", "", 200, "ListTemplates", nil, nil},
		{"GET", "/v1/templates/python-3.12", "", 200, "GetTemplate", []any{"python-3.12"}, nil},
		{"POST", "/v1/templates/build", `{"name":"busybox"}`, 200, "BuildTemplate", []any{api.BuildTemplateRequest{Name: "busybox"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			svc := &fakeService{}
			h, _ := newTestHandler(t, svc, Options{})
			rec := do(h, tc.method, tc.target, tc.body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tc.status, rec.Body)
			}
			if rec.Header().Get(api.VersionHeader) != "1.2.3" || len(rec.Header().Get(api.RequestIDHeader)) != 24 {
				t.Fatalf("headers %v", rec.Header())
			}
			name, args := svc.lastCall()
			if name != tc.call {
				t.Fatalf("called %q, want %q", name, tc.call)
			}
			if tc.wantArgs != nil && !reflect.DeepEqual(args, tc.wantArgs) {
				t.Fatalf("args %#v, want %#v", args, tc.wantArgs)
			}
			if tc.check != nil {
				tc.check(t, rec)
			}
		})
	}
}

func readEvents(t *testing.T, r io.Reader) []api.ExecEvent {
	t.Helper()
	var evs []api.ExecEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("bad ndjson line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestErrorMapping(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
	}{
		{errdefs.ErrInvalidArgument, 400, "invalid_argument"},
		{errdefs.ErrUnauthenticated, 401, "unauthenticated"},
		{errdefs.ErrPermissionDenied, 403, "permission_denied"},
		{errdefs.ErrNotFound, 404, "not_found"},
		{errdefs.ErrAlreadyExists, 409, "already_exists"},
		{errdefs.ErrConflict, 409, "conflict"},
		{errdefs.ErrFailedPrecondition, 412, "failed_precondition"},
		{errdefs.ErrTooLarge, 413, "too_large"},
		{errdefs.ErrResourceExhausted, 429, "resource_exhausted"},
		{errdefs.ErrNotImplemented, 501, "not_implemented"},
		{errdefs.ErrUnavailable, 503, "unavailable"},
		{errdefs.ErrDeadlineExceeded, 504, "deadline_exceeded"},
		{errdefs.ErrInternal, 500, "internal"},
		{fmt.Errorf("no category"), 500, "internal"},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			secret := "/var/lib/agentbox/secret-host-path"
			svc := &fakeService{err: fmt.Errorf("sandbox abc at %s: %w", secret, tc.err)}
			h, logs := newTestHandler(t, svc, Options{})
			rec := do(h, "GET", "/v1/sandboxes/abc", "")
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			e := decodeError(t, rec)
			if e.Code != tc.code {
				t.Fatalf("code %q, want %q", e.Code, tc.code)
			}
			if tc.status < 500 && !strings.Contains(e.Message, secret) {
				t.Fatalf("4xx message must be the error text, got %q", e.Message)
			}
			if tc.status >= 500 {
				if strings.Contains(e.Message, secret) {
					t.Fatalf("5xx leaks internal text: %q", e.Message)
				}
				if tc.status == 500 && e.Message != "internal error" {
					t.Fatalf("500 message %q", e.Message)
				}
				if !strings.Contains(logs.String(), secret) || !strings.Contains(logs.String(), "request_id="+e.RequestID) {
					t.Fatalf("5xx not logged with full error and request id: %s", logs)
				}
			}
		})
	}
}

func TestRequestLogLine(t *testing.T) {
	h, logs := newTestHandler(t, &fakeService{}, Options{})
	rec := do(h, "GET", "/v1/sandboxes/abc", "")
	id := rec.Header().Get(api.RequestIDHeader)
	line := logs.String()
	for _, want := range []string{"method=GET", "path=/v1/sandboxes/abc", "status=200", "duration=", "request_id=" + id} {
		if !strings.Contains(line, want) {
			t.Fatalf("log line %q lacks %q", line, want)
		}
	}
	rec2 := do(h, "GET", "/v1/health", "")
	if rec2.Header().Get(api.RequestIDHeader) == id {
		t.Fatal("request ids repeat")
	}
}

func TestPanicRecovered(t *testing.T) {
	svc := &fakeService{panicOn: "Info"}
	h, logs := newTestHandler(t, svc, Options{})
	rec := do(h, "GET", "/v1/info", "")
	if rec.Code != 500 {
		t.Fatalf("status %d", rec.Code)
	}
	e := decodeError(t, rec)
	if e.Message != "internal error" || strings.Contains(rec.Body.String(), "boom") || strings.Contains(rec.Body.String(), "goroutine") {
		t.Fatalf("panic leaked: %s", rec.Body)
	}
	if !strings.Contains(logs.String(), "boom in Info") {
		t.Fatalf("panic not logged: %s", logs)
	}
	// The handler keeps serving.
	if rec := do(h, "GET", "/v1/health", ""); rec.Code != 200 {
		t.Fatalf("after panic: %d", rec.Code)
	}
}

func TestNoRoute(t *testing.T) {
	h, _ := newTestHandler(t, &fakeService{}, Options{})
	rec := do(h, "GET", "/v1/nope", "")
	if rec.Code != 404 || decodeError(t, rec).Code != "not_found" {
		t.Fatalf("unknown route: %d %s", rec.Code, rec.Body)
	}
	rec = do(h, "PATCH", "/v1/sandboxes/abc", "")
	if rec.Code != 405 {
		t.Fatalf("wrong method: %d %s", rec.Code, rec.Body)
	}
	if e := decodeError(t, rec); e.Code != "method_not_allowed" {
		t.Fatalf("code %q", e.Code)
	}
	if allow := rec.Header().Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "DELETE") {
		t.Fatalf("Allow %q", allow)
	}
}

func TestInputValidation(t *testing.T) {
	long := "/" + strings.Repeat("a", 4096)
	cases := []struct {
		name, method, target, body string
		status                     int
		msg                        string
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"tempalte":"x"}`, 400, `"tempalte"`},
		{"malformed", "POST", "/v1/sandboxes", `{"template":`, 400, "malformed JSON"},
		{"syntax", "POST", "/v1/sandboxes", `{"template" "x"}`, 400, "malformed JSON"},
		{"wrong type", "POST", "/v1/sandboxes", `{"timeout_seconds":"x"}`, 400, "timeout_seconds"},
		{"duplicate key", "POST", "/v1/sandboxes", `{"template":"a","template":"b"}`, 400, `duplicate key "template"`},
		{"duplicate key by case", "POST", "/v1/sandboxes", `{"template":"a","TEMPLATE":"b"}`, 400, `duplicate key "TEMPLATE"`},
		{"duplicate nested key", "POST", "/v1/sandboxes", `{"resources":{"cpus":1,"Cpus":2}}`, 400, `in resources`},
		{"duplicate map key", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a"],"env":{"A":"1","A":"2"}}`, 400, `in env`},
		{"trailing garbage", "POST", "/v1/sandboxes", `{} {}`, 400, "after the JSON body"},
		{"trailing text", "POST", "/v1/sandboxes", `{}x`, 400, "after the JSON body"},
		{"not an object", "POST", "/v1/sandboxes", `[1]`, 400, "expected"},
		{"too large", "POST", "/v1/sandboxes", `{"hostname":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "larger than"},
		{"empty exec body", "POST", "/v1/sandboxes/abc/exec", "", 400, "body is required"},
		{"exec neither", "POST", "/v1/sandboxes/abc/exec", `{}`, 400, "exactly one of cmd or command"},
		{"exec both", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a"],"command":"b"}`, 400, "exactly one"},
		{"exec NUL arg", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a\u0000b"]}`, 400, "NUL"},
		{"exec relative cwd", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a"],"cwd":"tmp"}`, 400, "absolute"},
		{"exec bad env", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a"],"env":{"A=B":"c"}}`, 400, "variable name"},
		{"exec zero tty", "POST", "/v1/sandboxes/abc/exec", `{"cmd":["a"],"tty":{"rows":0,"cols":80}}`, 400, "tty"},
		{"empty signal body", "POST", "/v1/sandboxes/abc/processes/1/signal", "", 400, "body is required"},
		{"empty signal", "POST", "/v1/sandboxes/abc/processes/1/signal", `{}`, 400, "signal is required"},
		{"resize zero", "POST", "/v1/sandboxes/abc/processes/1/resize", `{"rows":0,"cols":0}`, 400, "positive"},
		{"bad id upper", "GET", "/v1/sandboxes/ABC", "", 400, "invalid sandbox id"},
		{"bad id dash", "GET", "/v1/sandboxes/-abc", "", 400, "invalid sandbox id"},
		{"bad id long", "GET", "/v1/sandboxes/" + strings.Repeat("a", 65), "", 400, "invalid sandbox id"},
		{"bad id NUL", "DELETE", "/v1/sandboxes/a%00b", "", 400, "invalid sandbox id"},
		{"unknown id", "GET", "/v1/sandboxes/missing", "", 404, "missing"},
		{"pid zero", "POST", "/v1/sandboxes/abc/processes/0/signal", `{"signal":"KILL"}`, 400, "invalid pid"},
		{"pid negative", "GET", "/v1/sandboxes/abc/processes/-3/attach", "", 400, "invalid pid"},
		{"pid text", "GET", "/v1/sandboxes/abc/processes/x/attach", "", 400, "invalid pid"},
		{"pid huge", "GET", "/v1/sandboxes/abc/processes/99999999999999999999/attach", "", 400, "invalid pid"},
		{"path missing", "GET", "/v1/sandboxes/abc/files", "", 400, "path is required"},
		{"path relative", "GET", "/v1/sandboxes/abc/fs/stat?path=etc/passwd", "", 400, "absolute"},
		{"path NUL", "GET", "/v1/sandboxes/abc/fs/stat?path=/etc%00x", "", 400, "NUL"},
		{"path long", "GET", "/v1/sandboxes/abc/fs/list?path=" + long, "", 400, "longer than 4096"},
		{"path twice", "DELETE", "/v1/sandboxes/abc/fs?path=/a&path=/b", "", 400, "more than once"},
		{"mkdir relative", "POST", "/v1/sandboxes/abc/fs/mkdir", `{"path":"x"}`, 400, "absolute"},
		{"mkdir bad mode", "POST", "/v1/sandboxes/abc/fs/mkdir", `{"path":"/x","mode":65535}`, 400, "mode"},
		{"move NUL", "POST", "/v1/sandboxes/abc/fs/move", `{"from":"/a\u0000","to":"/b"}`, 400, "NUL"},
		{"move missing to", "POST", "/v1/sandboxes/abc/fs/move", `{"from":"/a"}`, 400, "to is required"},
		{"bad mode", "PUT", "/v1/sandboxes/abc/files?path=/a&mode=999", "x", 400, "mode"},
		{"bad bool", "DELETE", "/v1/sandboxes/abc/fs?path=/a&recursive=maybe", "", 400, "recursive"},
		{"bad label", "GET", "/v1/sandboxes?label=novalue", "", 400, "key=value"},
		{"bad template name", "GET", "/v1/templates/-x", "", 400, "template name"},
		{"build neither", "POST", "/v1/templates/build", `{}`, 400, "exactly one of name or spec"},
		{"create negative", "POST", "/v1/sandboxes", `{"resources":{"cpus":-1}}`, 400, "negative"},
		{"create bad template", "POST", "/v1/sandboxes", `{"template":"../x"}`, 400, "template name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			h, _ := newTestHandler(t, svc, Options{})
			rec := do(h, tc.method, tc.target, tc.body)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			e := decodeError(t, rec)
			if !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("message %q lacks %q", e.Message, tc.msg)
			}
			if tc.status == 400 {
				if name, _ := svc.lastCall(); name != "" {
					t.Fatalf("service called (%s) despite invalid input", name)
				}
			}
		})
	}
}

func TestAuth(t *testing.T) {
	const key = "k-0123456789abcdef"
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{"other-key-xxxxxxxx", key}})
	rec := do(h, "GET", "/v1/info", "")
	if rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" || decodeError(t, rec).Code != "unauthenticated" {
		t.Fatalf("missing key: %d %v", rec.Code, rec.Header())
	}
	for _, bad := range []string{"Bearer wrong", "Bearer " + key + "x", "Basic " + key, "Bearer ", key} {
		if rec := do(h, "GET", "/v1/info", "", "Authorization", bad); rec.Code != 401 {
			t.Fatalf("%q: %d", bad, rec.Code)
		}
	}
	if rec := do(h, "GET", "/v1/info", "", "Authorization", "Bearer "+key); rec.Code != 200 {
		t.Fatalf("right key: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/v1/nope", "", "Authorization", "bearer "+key); rec.Code != 404 {
		t.Fatalf("auth before routing: %d", rec.Code)
	}
	// Fail closed without keys.
	h2, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true})
	if rec := do(h2, "GET", "/v1/health", "", "Authorization", "Bearer "); rec.Code != 401 {
		t.Fatalf("no keys: %d", rec.Code)
	}
	// The unix socket handler does not ask.
	h3, _ := newTestHandler(t, &fakeService{}, Options{})
	if rec := do(h3, "GET", "/v1/info", ""); rec.Code != 200 {
		t.Fatalf("unix: %d", rec.Code)
	}
}

func TestHostAndOrigin(t *testing.T) {
	const key = "k-0123456789abcdef"
	auth := []string{"Authorization", "Bearer " + key}
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{"localhost", "127.0.0.1:8080"}})
	req := func(host string, hdr ...string) int {
		r := httptest.NewRequest("GET", "/v1/info", nil)
		r.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	cases := []struct {
		host   string
		hdr    []string
		status int
	}{
		{"localhost:8080", auth, 200},
		{"LOCALHOST", auth, 200},
		{"127.0.0.1:8080", auth, 200},
		{"127.0.0.1:9999", auth, 403},
		{"evil.example:8080", auth, 403},
		{"localhost:8080", append([]string{"Origin", "http://evil.example"}, auth...), 403},
		{"localhost:8080", append([]string{"Origin", "null"}, auth...), 403},
		{"localhost:8080", append([]string{"Origin", "http://localhost:3000"}, auth...), 200},
		{"localhost:8080", append([]string{"Sec-Fetch-Site", "cross-site"}, auth...), 403},
		{"localhost:8080", nil, 401},
	}
	for _, tc := range cases {
		if got := req(tc.host, tc.hdr...); got != tc.status {
			t.Errorf("host %q hdr %v: %d, want %d", tc.host, tc.hdr, got, tc.status)
		}
	}
	// Without AllowedHosts only IP literals and localhost pass (no DNS
	// name can be rebound onto them), and any Origin is refused.
	h = New(&fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}, Logger: slog.New(slog.DiscardHandler)})
	for _, tc := range []struct {
		host   string
		hdr    []string
		status int
	}{
		{"127.0.0.1:8080", auth, 200},
		{"[::1]:8080", auth, 200},
		{"10.1.2.3", auth, 200},
		{"localhost:1", auth, 200},
		{"example.com", auth, 403},
		{"localhost.evil.example:8080", auth, 403},
		{"127.0.0.1:8080", append([]string{"Origin", "http://127.0.0.1:8080"}, auth...), 403},
	} {
		if got := req(tc.host, tc.hdr...); got != tc.status {
			t.Errorf("default: host %q hdr %v: %d, want %d", tc.host, tc.hdr, got, tc.status)
		}
	}
	// "*" accepts any host.
	h = New(&fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{"*"}, Logger: slog.New(slog.DiscardHandler)})
	if got := req("anything.example", auth...); got != 200 {
		t.Errorf("allowed host *: %d", got)
	}
}

// A sandbox's name works wherever its id does: the edge resolves the {id}
// of every route through Service.ResolveSandbox before the call.
func TestSandboxNameResolvedAtTheEdge(t *testing.T) {
	f := &fakeService{}
	h, _ := newTestHandler(t, f, Options{})
	if rec := do(h, "GET", "/v1/sandboxes/web1", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"id":"sb-web1"`) {
		t.Fatalf("GET by name: %d %s", rec.Code, rec.Body)
	}
	for _, c := range []struct{ method, target, body, call string }{
		{"DELETE", "/v1/sandboxes/web1", "", "DeleteSandbox"},
		{"GET", "/v1/sandboxes/web1/processes", "", "ListProcesses"},
		{"POST", "/v1/sandboxes/web1/processes/7/signal", `{"signal":"TERM"}`, "Signal"},
	} {
		rec := do(h, c.method, c.target, c.body, "Content-Type", "application/json")
		name, args := f.lastCall()
		if rec.Code >= 300 || name != c.call || len(args) == 0 || args[0] != "sb-web1" {
			t.Errorf("%s %s: %d %s; call %s%v, want %s(sb-web1, ...)", c.method, c.target, rec.Code, rec.Body, name, args, c.call)
		}
	}
	// An unknown name reaches the service unchanged (its not-found).
	if rec := do(h, "GET", "/v1/sandboxes/missing", ""); rec.Code != 404 {
		t.Errorf("GET unknown name: %d %s", rec.Code, rec.Body)
	}
}
