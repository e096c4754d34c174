package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
)

// codeSvc answers Exec with a stream of the given stdout pieces, stderr
// and exit code, and remembers the request.
type codeSvc struct {
	*fakeService
	stdout []string
	stderr string
	exit   int
	req    api.ExecRequest
}

func (s *codeSvc) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	s.req = req
	var evs []api.ExecEvent
	evs = append(evs, api.ExecEvent{Type: api.EventStarted, Pid: 7})
	for _, p := range s.stdout {
		evs = append(evs, api.ExecEvent{Type: api.EventStdout, Data: []byte(p)})
	}
	if s.stderr != "" {
		evs = append(evs, api.ExecEvent{Type: api.EventStderr, Data: []byte(s.stderr)})
	}
	code := s.exit
	evs = append(evs, api.ExecEvent{Type: api.EventExit, ExitCode: &code})
	return &errStream{events: evs, err: io.EOF}, nil
}

func codeEvents(t *testing.T, body string) []api.CodeEvent {
	t.Helper()
	var evs []api.CodeEvent
	dec := json.NewDecoder(strings.NewReader(body))
	for dec.More() {
		var ev api.CodeEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("%v in %q", err, body)
		}
		evs = append(evs, ev)
	}
	return evs
}

// The code route execs the runner's code client with the request on its
// stdin, and re-assembles its NDJSON however the output was cut.
func TestRunCode(t *testing.T) {
	svc := &codeSvc{fakeService: &fakeService{}, stdout: []string{
		`{"type":"stdout","text":"hi\n"}` + "\n" + `{"type":"res`,
		`ult","text":"42","is_main_result":true}` + "\n",
		`{"type":"end_of_execution"}` + "\n",
	}}
	h, logs := newTestHandler(t, svc, Options{})
	rec := do(h, "POST", "/v1/sandboxes/sb1/code", `{"code":"x","env":{"A":"b"},"timeout_seconds":3}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	evs := codeEvents(t, rec.Body.String())
	if len(evs) != 3 || evs[0].Text != "hi\n" || !evs[1].IsMainResult || evs[1].Text != "42" || evs[2].Type != api.CodeEventEndOfExecution {
		t.Fatalf("events %+v", evs)
	}
	if strings.Join(svc.req.Cmd, " ") != "/.agentbox/agentbox guest code-client execute" {
		t.Errorf("cmd %q", svc.req.Cmd)
	}
	var sent map[string]any
	if err := json.Unmarshal(svc.req.Stdin, &sent); err != nil || sent["code"] != "x" || sent["timeout"] != 3.0 || sent["env_vars"].(map[string]any)["A"] != "b" {
		t.Errorf("stdin %s: %v", svc.req.Stdin, err)
	}

	// A client that dies mid-stream ends the stream with stream_error
	// (its stderr goes to the log: a 5xx's text is not the client's).
	svc.stdout = []string{`{"type":"stdout","text":"a"}` + "\n"}
	svc.stderr, svc.exit = "panic: boom", 2
	evs = codeEvents(t, do(h, "POST", "/v1/sandboxes/sb1/code", `{"code":"x"}`).Body.String())
	if last := evs[len(evs)-1]; last.Type != api.CodeEventStreamError || last.Error == nil || last.Error.Code != "unavailable" {
		t.Fatalf("events %+v", evs)
	}
	if !strings.Contains(logs.String(), "panic: boom") {
		t.Errorf("the client's stderr is not in the log:\n%s", logs)
	}

	// A stream_error from the client before anything is an error response.
	svc.stdout = []string{`{"type":"stream_error","error":{"code":"not_found","message":"context \"c1\": not found"}}` + "\n"}
	svc.stderr, svc.exit = "", 1
	rec = do(h, "POST", "/v1/sandboxes/sb1/code", `{"code":"x","context":"c1"}`)
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), `context \"c1\"`) || strings.Contains(rec.Body.String(), "not found: not found") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}

	// Malformed lines from the sandbox are not passed on.
	svc.stdout = []string{"not json\n"}
	rec = do(h, "POST", "/v1/sandboxes/sb1/code", `{"code":"x"}`)
	if rec.Code != 500 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}

	for _, body := range []string{`{"code":"x","context":"c","language":"python"}`, `{"code":"x","language":"cobol"}`, `{"code":"x","context":"../x"}`, `{"code":"x","timeout_seconds":-1}`, `{"code":"x","env":{"A=B":"c"}}`} {
		if rec := do(h, "POST", "/v1/sandboxes/sb1/code", body); rec.Code != 400 {
			t.Errorf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
}

func TestCodeContexts(t *testing.T) {
	svc := &codeSvc{fakeService: &fakeService{}, stdout: []string{`{"id":"c1","language":"bash","cwd":"/root"}`}}
	h, _ := newTestHandler(t, svc, Options{})
	rec := do(h, "POST", "/v1/sandboxes/sb1/code/contexts", `{"language":"bash"}`)
	if rec.Code != 201 || !strings.Contains(rec.Body.String(), `"id":"c1"`) || strings.Join(svc.req.Cmd[3:], " ") != "create" {
		t.Fatalf("create: %d %s %q", rec.Code, rec.Body, svc.req.Cmd)
	}
	svc.stdout = []string{`{"contexts":[{"id":"c1","language":"bash","cwd":"/root"}]}`}
	if rec := do(h, "GET", "/v1/sandboxes/sb1/code/contexts", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"c1"`) {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	svc.stdout = nil
	if rec := do(h, "POST", "/v1/sandboxes/sb1/code/contexts/c1/restart", ""); rec.Code != 204 || strings.Join(svc.req.Cmd[3:], " ") != "restart c1" {
		t.Fatalf("restart: %d %s %q", rec.Code, rec.Body, svc.req.Cmd)
	}
	svc.stdout = []string{`{"type":"stream_error","error":{"code":"not_found","message":"context \"c2\": not found"}}` + "\n"}
	svc.exit = 1
	if rec := do(h, "DELETE", "/v1/sandboxes/sb1/code/contexts/c2", ""); rec.Code != 404 {
		t.Fatalf("delete unknown: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "DELETE", "/v1/sandboxes/sb1/code/contexts/a.b", ""); rec.Code != 400 {
		t.Fatalf("bad id: %d %s", rec.Code, rec.Body)
	}
}

// FuzzCodeStream: whatever the code client in the (untrusted) sandbox
// writes, however cut, the edge returns events with a type or an error,
// and ends.
func FuzzCodeStream(f *testing.F) {
	f.Add([]byte(`{"type":"stdout","text":"a"}`+"\n"+`{"type":"end_of_execution"}`+"\n"), uint8(3))
	f.Add([]byte("\n\n{}\n"), uint8(1))
	f.Add([]byte(`{"type":"stream_error","error":{"code":"not_found"}}`), uint8(0))
	f.Fuzz(func(t *testing.T, out []byte, cut uint8) {
		var evs []api.ExecEvent
		n := int(cut) + 1
		for len(out) > 0 {
			k := min(n, len(out))
			evs = append(evs, api.ExecEvent{Type: api.EventStdout, Data: out[:k]})
			out = out[k:]
		}
		zero := 0
		evs = append(evs, api.ExecEvent{Type: api.EventExit, ExitCode: &zero})
		cs := codeStream{stream: &errStream{events: evs, err: io.EOF}}
		for i := 0; ; i++ {
			ev, err := cs.next()
			if err != nil {
				return
			}
			if ev.Type == "" {
				t.Fatalf("event without a type")
			}
			if i > len(evs)*8+8 {
				t.Fatalf("no end")
			}
		}
	})
}
