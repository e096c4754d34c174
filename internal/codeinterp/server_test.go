package codeinterp

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// run executes code and returns its events.
func run(t *testing.T, s *Server, req ExecuteRequest) []api.CodeEvent {
	t.Helper()
	var evs []api.CodeEvent
	if err := s.Execute(context.Background(), req, func(ev api.CodeEvent) error { evs = append(evs, ev); return nil }); err != nil {
		t.Fatalf("execute %q: %v", req.Code, err)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != api.CodeEventEndOfExecution {
		t.Fatalf("execute %q: stream does not end with end_of_execution: %+v", req.Code, evs)
	}
	return evs
}

func mainResult(evs []api.CodeEvent) (api.CodeEvent, bool) {
	for _, ev := range evs {
		if ev.Type == api.CodeEventResult && ev.IsMainResult {
			return ev, true
		}
	}
	return api.CodeEvent{}, false
}

func output(evs []api.CodeEvent, stream string) string {
	var sb strings.Builder
	for _, ev := range evs {
		if ev.Type == stream {
			sb.WriteString(ev.Text)
		}
	}
	return sb.String()
}

func firstError(evs []api.CodeEvent) (api.CodeEvent, bool) {
	for _, ev := range evs {
		if ev.Type == api.CodeEventError {
			return ev, true
		}
	}
	return api.CodeEvent{}, false
}

func newServer(t *testing.T) *Server {
	s := New(Config{Cwd: t.TempDir()})
	t.Cleanup(s.Close)
	return s
}

// The Python driver against the host's python3: state persists in a
// context and not across contexts, the last expression is the result,
// stdout and stderr are the cell's own, errors carry a traceback.
func TestPython(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "x = 6*7"})
	evs := run(t, s, ExecuteRequest{Code: "x"})
	if r, ok := mainResult(evs); !ok || r.Text != "42" {
		t.Fatalf("x: %+v", evs)
	}
	evs = run(t, s, ExecuteRequest{Code: "import sys, os\nprint('out', flush=False)\nprint('err', file=sys.stderr)\nos.system('echo from-child')\n{'a': [1, 2]}"})
	if got := output(evs, api.CodeEventStdout); got != "out\nfrom-child\n" {
		t.Errorf("stdout %q", got)
	}
	if got := output(evs, api.CodeEventStderr); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	if r, ok := mainResult(evs); !ok || string(r.JSON) != `{"a":[1,2]}` || r.Text != "{'a': [1, 2]}" {
		t.Errorf("dict result: %+v", r)
	}
	if evs[len(evs)-2].Type != api.CodeEventNumberOfExecutions || evs[len(evs)-2].ExecutionCount != 3 {
		t.Errorf("execution count: %+v", evs[len(evs)-2])
	}

	evs = run(t, s, ExecuteRequest{Code: "def f():\n    raise ValueError('bad value')\nf()"})
	e, ok := firstError(evs)
	if !ok || e.Name != "ValueError" || e.Value != "bad value" || !strings.Contains(e.Traceback, "raise ValueError('bad value')") || strings.Contains(e.Traceback, "_run") || strings.Contains(e.Traceback, "ast.py") {
		t.Errorf("error: %+v", e)
	}
	evs = run(t, s, ExecuteRequest{Code: "1 +"})
	if e, ok := firstError(evs); !ok || e.Name != "SyntaxError" || strings.Contains(e.Traceback, "ast.py") {
		t.Errorf("syntax error: %+v", evs)
	}
	// Still the same context after errors.
	if r, _ := mainResult(run(t, s, ExecuteRequest{Code: "x + 1"})); r.Text != "43" {
		t.Errorf("after errors: %+v", r)
	}

	// Another context does not see x.
	c, err := s.CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := firstError(run(t, s, ExecuteRequest{Code: "x", ContextID: c.ID})); !ok || e.Name != "NameError" {
		t.Errorf("x in a new context: %+v", e)
	}
	// Env for one cell.
	evs = run(t, s, ExecuteRequest{Code: "import os; os.environ.get('ABX_V')", ContextID: c.ID, EnvVars: map[string]string{"ABX_V": "v1"}})
	if r, _ := mainResult(evs); r.Text != "'v1'" {
		t.Errorf("env: %+v", r)
	}
	if r, _ := mainResult(run(t, s, ExecuteRequest{Code: "os.environ.get('ABX_V')", ContextID: c.ID})); r.Text != "" {
		t.Errorf("env left over: %+v", r)
	}
	// Restart loses state; delete forgets the context.
	run(t, s, ExecuteRequest{Code: "y = 1", ContextID: c.ID})
	if err := s.RestartContext(c.ID); err != nil {
		t.Fatal(err)
	}
	if e, ok := firstError(run(t, s, ExecuteRequest{Code: "y", ContextID: c.ID})); !ok || e.Name != "NameError" {
		t.Errorf("y after restart: %+v", e)
	}
	if err := s.DeleteContext(c.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Execute(context.Background(), ExecuteRequest{Code: "1", ContextID: c.ID}, func(api.CodeEvent) error { return nil }); !errdefs.IsNotFound(err) {
		t.Errorf("deleted context: %v", err)
	}
	if err := s.Execute(context.Background(), ExecuteRequest{Code: "1", ContextID: "x", Language: "python"}, func(api.CodeEvent) error { return nil }); !errdefs.IsInvalidArgument(err) {
		t.Errorf("context and language: %v", err)
	}
}

// Rich results: an object's _repr_html_ and _repr_png_, and a result
// whose output holds a marker-like and a multi-byte tail.
func TestPythonRich(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	evs := run(t, s, ExecuteRequest{Code: "class T:\n    def _repr_html_(self): return '<table></table>'\n    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n'\n    def __repr__(self): return 'T()'\nprint('é' * 3, end='')\nprint('\\x1eagentbox-cell-end-', end='')\nT()"})
	r, ok := mainResult(evs)
	if !ok || r.HTML != "<table></table>" || r.Text != "T()" {
		t.Fatalf("result %+v", evs)
	}
	if b, err := base64.StdEncoding.DecodeString(r.PNG); err != nil || string(b[:4]) != "\x89PNG" {
		t.Errorf("png %q %v", r.PNG, err)
	}
	if got := output(evs, api.CodeEventStdout); got != "ééé\x1eagentbox-cell-end-" {
		t.Errorf("stdout %q", got)
	}
}

// Stdout reaches the caller while the cell still runs.
func TestPythonStreams(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	first := make(chan time.Time, 1)
	var end time.Time
	err := s.Execute(context.Background(), ExecuteRequest{Code: "import time\nprint('early')\ntime.sleep(1.5)\nprint('late')"}, func(ev api.CodeEvent) error {
		if ev.Type == api.CodeEventStdout && strings.Contains(ev.Text, "early") {
			first <- time.Now()
		}
		if ev.Type == api.CodeEventEndOfExecution {
			end = time.Now()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-first:
		if end.Sub(at) < time.Second {
			t.Errorf("early output came %v before the end", end.Sub(at))
		}
	default:
		t.Fatal("no early output")
	}
}

// A timeout interrupts the cell (KeyboardInterrupt, reported as a
// TimeoutError) and the context keeps its state; a cell that ignores the
// interrupt gets its context restarted.
func TestPythonTimeout(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "kept = 7"})
	evs := run(t, s, ExecuteRequest{Code: "import time\nwhile True: time.sleep(0.05)", Timeout: 0.5})
	if e, ok := firstError(evs); !ok || e.Name != "TimeoutError" || !strings.Contains(e.Value, "KeyboardInterrupt") && !strings.Contains(e.Traceback, "KeyboardInterrupt") {
		t.Fatalf("timeout: %+v", evs)
	}
	if r, _ := mainResult(run(t, s, ExecuteRequest{Code: "kept"})); r.Text != "7" {
		t.Errorf("state after an interrupt: %+v", r)
	}
}

func TestBash(t *testing.T) {
	testutil.RequiresBinary(t, "bash")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "X=41; cd /", Language: "bash"})
	evs := run(t, s, ExecuteRequest{Code: "echo $((X+1)) $PWD $ABX_E", Language: "bash", EnvVars: map[string]string{"ABX_E": "it's"}})
	if got := output(evs, api.CodeEventStdout); got != "42 / it's\n" {
		t.Errorf("bash stdout %q", got)
	}
	evs = run(t, s, ExecuteRequest{Code: "false", Language: "bash"})
	if e, ok := firstError(evs); !ok || e.Name != "ExitStatus" {
		t.Errorf("bash false: %+v", evs)
	}
	evs = run(t, s, ExecuteRequest{Code: "exit 3", Language: "bash"})
	if e, ok := firstError(evs); !ok || e.Name != "ContextExited" {
		t.Errorf("bash exit: %+v", evs)
	}
	if got := output(run(t, s, ExecuteRequest{Code: "echo ${X:-gone}", Language: "bash"}), api.CodeEventStdout); got != "gone\n" {
		t.Errorf("after exit %q", got)
	}
}

func TestJavaScript(t *testing.T) {
	testutil.RequiresBinary(t, "node")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "var x = 6*7; console.log('hi')", Language: "js"})
	evs := run(t, s, ExecuteRequest{Code: "({x, y: [1]})", Language: "javascript"})
	if r, ok := mainResult(evs); !ok || string(r.JSON) != `{"x":42,"y":[1]}` {
		t.Errorf("js result %+v", evs)
	}
	evs = run(t, s, ExecuteRequest{Code: "null.f", Language: "js"})
	if e, ok := firstError(evs); !ok || e.Name != "TypeError" {
		t.Errorf("js error %+v", evs)
	}
}

// Top-level await in a Python cell.
func TestPythonAwait(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	evs := run(t, s, ExecuteRequest{Code: "import asyncio\nasync def f():\n    await asyncio.sleep(0.01)\n    return 5\nv = await f()\nv * 2"})
	if r, ok := mainResult(evs); !ok || r.Text != "10" {
		t.Fatalf("await: %+v", evs)
	}
}

// A bash cell's timeout interrupts its command; the context lives on.
func TestBashTimeout(t *testing.T) {
	testutil.RequiresBinary(t, "bash")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "KEEP=yes", Language: "bash"})
	evs := run(t, s, ExecuteRequest{Code: "sleep 30", Language: "bash", Timeout: 0.5})
	if e, ok := firstError(evs); !ok || e.Name != "TimeoutError" {
		t.Fatalf("timeout: %+v", evs)
	}
	if got := output(run(t, s, ExecuteRequest{Code: "echo $KEEP", Language: "bash"}), api.CodeEventStdout); got != "yes\n" {
		t.Fatalf("after the timeout: %q", got)
	}
}

// A cell that ignores the interrupt while flooding its stdout has its
// context killed and restarted, without the server hanging on the output
// nobody reads any more.
func TestPythonTimeoutIgnored(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	s := newServer(t)
	run(t, s, ExecuteRequest{Code: "lost = 1"})
	var n int
	err := s.Execute(context.Background(), ExecuteRequest{Code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    print('x' * 4096)", Timeout: 0.3}, func(ev api.CodeEvent) error {
		n++
		if ev.Type == api.CodeEventError && (ev.Name != "TimeoutError" || !strings.Contains(ev.Value, "restarted")) {
			t.Errorf("error %+v", ev)
		}
		return nil
	})
	if err != nil || n < 3 {
		t.Fatalf("execute: %v, %d events", err, n)
	}
	if e, ok := firstError(run(t, s, ExecuteRequest{Code: "lost"})); !ok || e.Name != "NameError" {
		t.Fatalf("after a restart: %+v", e)
	}
}
