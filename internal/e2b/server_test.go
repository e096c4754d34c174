package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// testServer serves a fake with keys "key-a" and "key-b" (tenants a and
// b) and "key-r" (tenant a, read-only).
func testServer(t *testing.T, ports map[int]PortHandler) (*fakeSandboxes, *Server, *httptest.Server) {
	t.Helper()
	return testServerWith(t, Config{Ports: ports})
}

// testServerWith is testServer with more of cfg (its Authenticate is
// replaced).
func testServerWith(t *testing.T, cfg Config) (*fakeSandboxes, *Server, *httptest.Server) {
	t.Helper()
	f := newFake()
	auth := func(key string) (tenant.Principal, error) {
		switch key {
		case "key-a":
			return tenant.Principal{Tenant: "a", Scope: api.ScopeFull, KeyID: "ka"}, nil
		case "key-b":
			return tenant.Principal{Tenant: "b", Scope: api.ScopeFull, KeyID: "kb"}, nil
		case "key-r":
			return tenant.Principal{Tenant: "a", Scope: api.ScopeRead, KeyID: "kr"}, nil
		}
		return tenant.Principal{}, errdefs.ErrUnauthenticated
	}
	cfg.Authenticate = auth
	s, err := New(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return f, s, srv
}

// call sends a control-plane request and decodes the JSON answer into out
// (when not nil); it returns the status.
func call(t *testing.T, srv *httptest.Server, key, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

func create(t *testing.T, srv *httptest.Server, key, body string) sandboxCreated {
	t.Helper()
	var c sandboxCreated
	if st := call(t, srv, key, "POST", "/v2/sandboxes", body, &c); st != http.StatusCreated {
		t.Fatalf("create: %d %+v", st, c)
	}
	return c
}

func TestCreateGetList(t *testing.T) {
	f, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{"metadata":{"k":"v","run":"1"},"timeout":60,"envVars":{"A":"1"},"unknownField":true}`)
	if c.EnvdVersion != EnvdVersion || c.EnvdAccessToken == "" || c.TemplateID != "base" || c.Domain != nil {
		t.Errorf("created %+v", c)
	}
	sb := f.sbs[c.SandboxID]
	if sb.Template != "debian" || sb.Labels[MetadataPrefix+"k"] != "v" || sb.Labels[LabelTemplate] != "base" || sb.Env["A"] != "1" || sb.ExpiresAt == nil {
		t.Errorf("agentbox sandbox %+v", sb)
	}
	if len(f.execs) != 1 || f.execs[0].User != "root" || f.lastWho != "e2b:tenant:a/key:ka" {
		t.Errorf("set-up run %+v by %q", f.execs, f.lastWho)
	}
	var d sandboxDetail
	if st := call(t, srv, "key-a", "GET", "/sandboxes/"+c.SandboxID, "", &d); st != 200 || d.Metadata["k"] != "v" || d.State != "running" || d.EnvdAccessToken != c.EnvdAccessToken {
		t.Errorf("get: %d %+v", st, d)
	}
	create(t, srv, "key-a", `{"metadata":{"run":"2"}}`)
	create(t, srv, "key-b", `{"metadata":{"run":"1"}}`)
	var l []sandboxDetail
	if st := call(t, srv, "key-a", "GET", "/v2/sandboxes?metadata="+urlEscape("run=1"), "", &l); st != 200 || len(l) != 1 || l[0].SandboxID != c.SandboxID {
		t.Errorf("list by metadata: %d %+v", st, l)
	}
	// Pagination: two pages of one, newest first.
	req, _ := http.NewRequest("GET", srv.URL+"/v2/sandboxes?limit=1", nil)
	req.Header.Set("X-API-KEY", "key-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p1 []sandboxDetail
	_ = json.NewDecoder(resp.Body).Decode(&p1)
	resp.Body.Close()
	next := resp.Header.Get("X-Next-Token")
	var p2 []sandboxDetail
	if st := call(t, srv, "key-a", "GET", "/v2/sandboxes?limit=1&nextToken="+next, "", &p2); st != 200 || len(p1) != 1 || len(p2) != 1 || next == "" || p1[0].SandboxID == p2[0].SandboxID || p2[0].SandboxID != c.SandboxID {
		t.Errorf("pages %+v (next %q) %+v", p1, next, p2)
	}
	if st := call(t, srv, "key-a", "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":600}`, nil); st != 204 || f.timeouts[c.SandboxID].Seconds() != 600 {
		t.Errorf("timeout: %d %v", st, f.timeouts)
	}
	if st := call(t, srv, "key-a", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", nil); st != 204 {
		t.Errorf("pause: %d", st)
	}
	if st := call(t, srv, "key-a", "POST", "/sandboxes/"+c.SandboxID+"/pause", "", nil); st != 409 {
		t.Errorf("pause of a paused sandbox: %d, want 409", st)
	}
	var cc sandboxCreated
	if st := call(t, srv, "key-a", "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", `{"timeout":30}`, &cc); st != 201 || cc.EnvdAccessToken != c.EnvdAccessToken || f.sbs[c.SandboxID].State != api.StateRunning {
		t.Errorf("connect: %d %+v", st, cc)
	}
	var m []sandboxMetric
	if st := call(t, srv, "key-a", "GET", "/sandboxes/"+c.SandboxID+"/metrics", "", &m); st != 200 || len(m) != 1 || m[0].MemUsed != 1<<20 {
		t.Errorf("metrics: %d %+v", st, m)
	}
	var logs sandboxLogs
	if st := call(t, srv, "key-a", "GET", "/sandboxes/"+c.SandboxID+"/logs", "", &logs); st != 200 || len(logs.Logs) != 2 || logs.Logs[1].Line != "running -> paused (api)" || logs.LogEntries[0].Fields["cause"] != "create" {
		t.Errorf("logs: %d %+v", st, logs)
	}
	var logs2 sandboxLogsV2
	start := strconv.FormatInt(f.sbs[c.SandboxID].CreatedAt.Add(time.Second).UnixMilli(), 10)
	if st := call(t, srv, "key-a", "GET", "/v2/sandboxes/"+c.SandboxID+"/logs?start="+start, "", &logs2); st != 200 || len(logs2.Logs) != 1 {
		t.Errorf("logs v2 from start: %d %+v", st, logs2)
	}
	if st := call(t, srv, "key-a", "DELETE", "/sandboxes/"+c.SandboxID, "", nil); st != 204 {
		t.Errorf("kill: %d", st)
	}
}

func urlEscape(s string) string { return strings.NewReplacer("=", "%3D", "&", "%26").Replace(s) }

// Another tenant's sandbox is answered exactly as an unknown id, with
// E2B's {code, message} body.
func TestOtherTenantIsNotFound(t *testing.T) {
	_, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{}`)
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/%s", ""},
		{"DELETE", "/sandboxes/%s", ""},
		{"POST", "/sandboxes/%s/timeout", `{"timeout":5}`},
		{"POST", "/sandboxes/%s/pause", ""},
		{"POST", "/v2/sandboxes/%s/connect", `{}`},
		{"GET", "/sandboxes/%s/metrics", ""},
		{"GET", "/sandboxes/%s/logs", ""},
		{"POST", "/sandboxes/%s/refreshes", `{"duration":5}`},
	} {
		var other, unknown apiError
		so := call(t, srv, "key-b", rt.method, fmt.Sprintf(rt.path, c.SandboxID), rt.body, &other)
		su := call(t, srv, "key-b", rt.method, fmt.Sprintf(rt.path, "zzzzzzzzzzzz"), rt.body, &unknown)
		if so != 404 || su != 404 || other.Code != 404 || unknown.Code != 404 ||
			strings.ReplaceAll(other.Message, c.SandboxID, "ID") != strings.ReplaceAll(unknown.Message, "zzzzzzzzzzzz", "ID") {
			t.Errorf("%s %s: other tenant's %d %+v, unknown %d %+v", rt.method, rt.path, so, other, su, unknown)
		}
	}
	var l []sandboxDetail
	if call(t, srv, "key-b", "GET", "/v2/sandboxes", "", &l); len(l) != 0 {
		t.Errorf("tenant b lists %+v", l)
	}
}

func TestControlPlaneAuth(t *testing.T) {
	_, _, srv := testServer(t, nil)
	var e apiError
	if st := call(t, srv, "", "GET", "/v2/sandboxes", "", &e); st != 401 || e.Code != 401 {
		t.Errorf("no key: %d %+v", st, e)
	}
	if st := call(t, srv, "wrong", "GET", "/v2/sandboxes", "", &e); st != 401 || e.Code != 401 {
		t.Errorf("wrong key: %d %+v", st, e)
	}
	if st := call(t, srv, "key-r", "POST", "/v2/sandboxes", "{}", &e); st != 403 || e.Code != 403 {
		t.Errorf("read-only key creating: %d %+v", st, e)
	}
	if st := call(t, srv, "key-r", "GET", "/v2/sandboxes", "", nil); st != 200 {
		t.Errorf("read-only key listing: %d", st)
	}
	if st := call(t, srv, "key-a", "GET", "/nope", "", &e); st != 404 || e.Code != 404 {
		t.Errorf("unknown route: %d %+v", st, e)
	}
	if st := call(t, srv, "key-a", "POST", "/v2/sandboxes", `{"templateID":"missing"}`, &e); st != 404 || e.Code != 404 {
		t.Errorf("unknown template: %d %+v", st, e)
	}
	if st := call(t, srv, "key-a", "POST", "/v2/sandboxes", `{"metadata":{"":"c"}}`, &e); st != 400 || e.Code != 400 {
		t.Errorf("bad metadata key: %d %+v", st, e)
	}
}

// envdRequest sends sandbox traffic with the given token and port.
func envdRequest(t *testing.T, srv *httptest.Server, id, token, port, method, path string, body io.Reader, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(headerSandboxID, id)
	if port != "" {
		req.Header.Set(headerSandboxPort, port)
	}
	if token != "" {
		req.Header.Set(headerAccessToken, token)
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

type portRecorder struct {
	id, owner, tokens string
}

func (p *portRecorder) ServeSandboxPort(w http.ResponseWriter, r *http.Request, id string) error {
	p.id, p.owner = id, tenant.From(r.Context()).Tenant
	p.tokens = r.Header.Get(headerAccessToken) + r.Header.Get(headerTrafficToken)
	w.WriteHeader(http.StatusTeapot)
	return nil
}

// Sandbox traffic needs the sandbox's own access token: none, another
// sandbox's, a forged owner or a non-canonical port are refused; a valid
// one runs as the sandbox's owner, on envd or the port's handler.
func TestEnvdAccessTokens(t *testing.T) {
	ci := &portRecorder{}
	_, s, srv := testServer(t, map[int]PortHandler{CodeInterpreterPort: ci})
	a := create(t, srv, "key-a", `{}`)
	b := create(t, srv, "key-a", `{}`)
	if st, _ := envdRequest(t, srv, a.SandboxID, a.EnvdAccessToken, "49983", "GET", "/health", nil, nil); st != 204 {
		t.Errorf("health with the token: %d", st)
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, "", "", "GET", "/health", nil, nil); st != 401 {
		t.Errorf("no token: %d", st)
	}
	if st, _ := envdRequest(t, srv, b.SandboxID, a.EnvdAccessToken, "", "GET", "/health", nil, nil); st != 401 {
		t.Errorf("another sandbox's token: %d", st)
	}
	_, mac, _ := strings.Cut(a.EnvdAccessToken, ".")
	forged := base64.RawURLEncoding.EncodeToString([]byte("b")) + "." + mac
	if st, _ := envdRequest(t, srv, a.SandboxID, forged, "", "GET", "/health", nil, nil); st != 401 {
		t.Errorf("forged owner: %d", st)
	}
	other := s.tok.mint("b", a.SandboxID) // minted for another owner: runs as b, who cannot see it
	if st, _ := envdRequest(t, srv, a.SandboxID, other, "", "GET", "/files?path=/x", nil, nil); st != 404 {
		t.Errorf("a token naming another tenant: %d, want 404", st)
	}
	for _, port := range []string{"049983", "+49983", "0xc34f", "99999", "x"} {
		if st, _ := envdRequest(t, srv, a.SandboxID, a.EnvdAccessToken, port, "GET", "/health", nil, nil); st != 400 {
			t.Errorf("port %q: %d, want 400", port, st)
		}
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, a.EnvdAccessToken, "8080", "GET", "/", nil, nil); st != 404 {
		t.Errorf("an unserved port: %d", st)
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, a.EnvdAccessToken, "49999", "GET", "/", nil, nil); st != http.StatusTeapot || ci.id != a.SandboxID || ci.owner != "a" || ci.tokens != "" {
		t.Errorf("code interpreter port: %d %+v", st, ci)
	}

	// The traffic token (what the code-interpreter SDK sends on context
	// calls) opens the code interpreter's port, never envd's, and only
	// of its own sandbox.
	if a.TrafficAccessToken == "" || a.TrafficAccessToken == a.EnvdAccessToken {
		t.Fatalf("traffic token %q (envd token %q)", a.TrafficAccessToken, a.EnvdAccessToken)
	}
	traffic := func(tok string) map[string]string { return map[string]string{headerTrafficToken: tok} }
	*ci = portRecorder{}
	if st, _ := envdRequest(t, srv, a.SandboxID, "", "49999", "GET", "/contexts", nil, traffic(a.TrafficAccessToken)); st != http.StatusTeapot || ci.owner != "a" || ci.tokens != "" {
		t.Errorf("code interpreter port with the traffic token: %d %+v", st, ci)
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, "", "49983", "GET", "/health", nil, traffic(a.TrafficAccessToken)); st != 401 {
		t.Errorf("envd with the traffic token: %d, want 401", st)
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, a.TrafficAccessToken, "", "GET", "/health", nil, nil); st != 401 {
		t.Errorf("envd with the traffic token as X-Access-Token: %d, want 401", st)
	}
	if st, _ := envdRequest(t, srv, b.SandboxID, "", "49999", "GET", "/contexts", nil, traffic(a.TrafficAccessToken)); st != 401 {
		t.Errorf("another sandbox's traffic token: %d, want 401", st)
	}
	if st, _ := envdRequest(t, srv, a.SandboxID, "", "49999", "GET", "/contexts", nil, traffic(a.EnvdAccessToken)); st != 401 {
		t.Errorf("the envd token as the traffic token: %d, want 401", st)
	}
}

func TestFilesREST(t *testing.T) {
	f, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{}`)
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormFile("file", "rel/a.txt")
	fw.Write([]byte("hello"))
	mw.Close()
	st, b := envdRequest(t, srv, c.SandboxID, c.EnvdAccessToken, "", "POST", "/files", &mp, map[string]string{"Content-Type": mw.FormDataContentType()})
	var wf []writtenFile
	if err := json.Unmarshal(b, &wf); st != 200 || err != nil || len(wf) != 1 || wf[0].Path != "/home/user/rel/a.txt" || wf[0].Type != "file" {
		t.Fatalf("multipart upload: %d %s", st, b)
	}
	if st, b := envdRequest(t, srv, c.SandboxID, c.EnvdAccessToken, "", "POST", "/files?path=/tmp/b&username=root", strings.NewReader("raw"), map[string]string{"Content-Type": "application/octet-stream"}); st != 200 || string(f.files[c.SandboxID+"/tmp/b"]) != "raw" {
		t.Fatalf("octet-stream upload: %d %s", st, b)
	}
	if st, b := envdRequest(t, srv, c.SandboxID, c.EnvdAccessToken, "", "GET", "/files?path=rel/a.txt", nil, nil); st != 200 || string(b) != "hello" {
		t.Errorf("read: %d %q", st, b)
	}
	if st, b := envdRequest(t, srv, c.SandboxID, c.EnvdAccessToken, "", "GET", "/files?path=~/rel/a.txt&username=root", nil, nil); st != 404 {
		t.Errorf("root's home is /root: %d %q", st, b)
	}
	var e apiError
	st, b = envdRequest(t, srv, c.SandboxID, c.EnvdAccessToken, "", "GET", "/files?path=/missing", nil, nil)
	if err := json.Unmarshal(b, &e); st != 404 || err != nil || e.Code != 404 {
		t.Errorf("missing: %d %s", st, b)
	}
}

// envdClient is a Connect client of procedure with the JSON codec and the
// sandbox's headers.
func startProcess(t *testing.T, srv *httptest.Server, c sandboxCreated, user string, req *startRequest) ([]*processEvent, error) {
	t.Helper()
	cl := connect.NewClient[startRequest, processEventResponse](http.DefaultClient, srv.URL+processService+"Start", connect.WithCodec(jsonCodec{}))
	r := connect.NewRequest(req)
	r.Header().Set(headerSandboxID, c.SandboxID)
	r.Header().Set(headerAccessToken, c.EnvdAccessToken)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	st, err := cl.CallServerStream(context.Background(), r)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var evs []*processEvent
	for st.Receive() {
		evs = append(evs, st.Msg().Event)
	}
	return evs, st.Err()
}

func TestProcessStart(t *testing.T) {
	f, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{}`)
	cwd := "sub"
	evs, err := startProcess(t, srv, c, "", &startRequest{Process: &processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"X": "1"}, Cwd: &cwd}})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 || evs[0].Start == nil || evs[0].Start.Pid != 7 || string(evs[1].Data.Stdout) != "out:echo hi" || string(evs[2].Data.Stderr) != "err" ||
		evs[3].End == nil || evs[3].End.ExitCode != 0 || !evs[3].End.Exited || evs[3].End.Status != "exit status 0" {
		t.Fatalf("events %s", mustJSON(evs))
	}
	er := f.execs[len(f.execs)-1]
	if er.User != "user" || er.Cwd != "/home/user/sub" || er.Env["X"] != "1" || er.Env["HOME"] != "/home/user" || !er.StdinOpen || f.lastWho != "e2b-envd:tenant:a" {
		t.Errorf("exec request %+v by %q", er, f.lastWho)
	}
	f.exits = 3
	no := false
	evs, err = startProcess(t, srv, c, "root", &startRequest{Process: &processConfig{Cmd: "false"}, Stdin: &no})
	if err != nil {
		t.Fatal(err)
	}
	if end := evs[len(evs)-1].End; end == nil || end.ExitCode != 3 || end.Status != "exit status 3" {
		t.Errorf("exit 3: %s", mustJSON(evs))
	}
	if er := f.execs[len(f.execs)-1]; er.User != "root" || er.Cwd != "/root" || er.StdinOpen {
		t.Errorf("as root: %+v", er)
	}
	_, err = startProcess(t, srv, c, "bad user!", &startRequest{Process: &processConfig{Cmd: "true"}})
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("bad user: %v", err)
	}
	other := create(t, srv, "key-b", `{}`)
	other.SandboxID = c.SandboxID // b's token is not a's sandbox's
	if _, err = startProcess(t, srv, other, "", &startRequest{Process: &processConfig{Cmd: "true"}}); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("another sandbox's token: %v", err)
	}
}

func TestProcessControl(t *testing.T) {
	f, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{}`)
	unary := func(proc string, body any, out any) error {
		cl := connect.NewClient[any, json.RawMessage](http.DefaultClient, srv.URL+proc, connect.WithCodec(jsonCodec{}))
		r := connect.NewRequest(&body)
		r.Header().Set(headerSandboxID, c.SandboxID)
		r.Header().Set(headerAccessToken, c.EnvdAccessToken)
		resp, err := cl.CallUnary(context.Background(), r)
		if err != nil {
			return err
		}
		if out != nil {
			return json.Unmarshal(*resp.Msg, out)
		}
		return nil
	}
	var l listResponse
	if err := unary(processService+"List", map[string]any{}, &l); err != nil || len(l.Processes) != 1 || l.Processes[0].Pid != 7 || l.Processes[0].Config.Cmd != "/bin/bash" {
		t.Errorf("list: %v %+v", err, l)
	}
	if err := unary(processService+"SendInput", map[string]any{"process": map[string]any{"pid": 7}, "input": map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("abc"))}}, nil); err != nil || f.stdin.String() != "abc" {
		t.Errorf("send input: %v %q", err, f.stdin.String())
	}
	if err := unary(processService+"SendSignal", map[string]any{"process": map[string]any{"pid": 7}, "signal": "SIGNAL_SIGKILL"}, nil); err != nil || len(f.signals) != 1 || f.signals[0] != "7:KILL" {
		t.Errorf("signal: %v %v", err, f.signals)
	}
	if err := unary(processService+"SendSignal", map[string]any{"process": map[string]any{"pid": 7}, "signal": 2}, nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("SIGINT: %v", err)
	}
	if err := unary(processService+"SendInput", map[string]any{"process": map[string]any{"tag": "nope"}}, nil); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown tag: %v", err)
	}
	if err := unary(filesystemService+"MakeDir", map[string]any{"path": "/tmp/b"}, nil); err != nil {
		t.Errorf("mkdir: %v", err)
	}
	var stat entryResponse
	if err := unary(filesystemService+"Stat", map[string]any{"path": "/missing"}, &stat); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stat of a missing path: %v", err)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// StreamInput (a client stream; the SDK does not use it) writes each
// data message to the selected process's stdin, in order.
func TestStreamInput(t *testing.T) {
	f, _, srv := testServer(t, nil)
	c := create(t, srv, "key-a", `{}`)
	cl := connect.NewClient[streamInputRequest, empty](http.DefaultClient, srv.URL+processService+"StreamInput", connect.WithCodec(jsonCodec{}))
	st := cl.CallClientStream(context.Background())
	st.RequestHeader().Set(headerSandboxID, c.SandboxID)
	st.RequestHeader().Set(headerAccessToken, c.EnvdAccessToken)
	pid := uint32(7)
	msgs := []*streamInputRequest{{Start: &struct {
		Process *processSelector `json:"process"`
	}{Process: &processSelector{Pid: &pid}}}}
	for _, s := range []string{"one ", "two"} {
		msgs = append(msgs, &streamInputRequest{Data: &struct {
			Input *processInput `json:"input"`
		}{Input: &processInput{Stdin: []byte(s)}}})
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if got := f.stdin.String(); got != "one two" {
		t.Errorf("stdin %q", got)
	}
}

// A revoked key ends its control-plane requests: Track's context is the
// request's.
func TestTrackRevocation(t *testing.T) {
	f := newFake()
	f.sbs["sbx000000001"] = api.Sandbox{ID: "sbx000000001", Tenant: "a", State: api.StateRunning}
	tracked := 0
	s, err := New(f, Config{
		Authenticate: func(key string) (tenant.Principal, error) {
			return tenant.Principal{Tenant: "a", Scope: api.ScopeFull, KeyID: "k"}, nil
		},
		Track: func(ctx context.Context, p tenant.Principal) (context.Context, func()) {
			tracked++
			ctx, cancel := context.WithCancel(ctx)
			cancel() // revoked already
			return ctx, func() {}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	defer srv.Close()
	var e apiError
	// metrics waits on the request's context between its two samples.
	st := call(t, srv, "k", "GET", "/sandboxes/sbx000000001/metrics", "", &e)
	if tracked != 1 || st == http.StatusOK {
		t.Errorf("tracked %d, status %d %+v", tracked, st, e)
	}
}
