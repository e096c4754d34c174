package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestCodeInterpreter drives the code interpreter (docs/CODE-INTERPRETER.md)
// in a sandbox of the builtin code-interpreter template, built here with
// mmdebstrap from Debian's mirror (2-5 minutes on first use in this
// daemon's fresh data dir). The subtest E2B drives the same template
// through `agentbox serve --e2b` with the real @e2b/code-interpreter SDK.
func TestCodeInterpreter(t *testing.T) {
	testutil.Short(t)
	testutil.RequiresBinary(t, "mmdebstrap")
	tcpAddr, e2bAddr := loopbackAddr(t), loopbackAddr(t)
	d := newDaemonWith(t, "--tcp", tcpAddr, "--e2b", e2bAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "code-interpreter"}, nil); err != nil {
		t.Fatalf("building the code-interpreter template: %v", err)
	}
	t.Run("E2B", func(t *testing.T) { testCodeInterpreterE2B(t, d, "http://"+tcpAddr, "http://"+e2bAddr) })
	sb := d.create(t, agentbox.SandboxSpec{Template: "code-interpreter"})

	runCode := func(code string, opts agentbox.CodeOptions) *agentbox.Execution {
		t.Helper()
		ex, err := sb.RunCode(ctx, code, opts)
		if err != nil {
			t.Fatalf("run code %q: %v", code, err)
		}
		return ex
	}

	// State persists in the default context.
	if ex := runCode("x = 6*7", agentbox.CodeOptions{}); ex.Error != nil || len(ex.Results) != 0 {
		t.Fatalf("x = 6*7: %+v", ex)
	}
	if ex := runCode("x", agentbox.CodeOptions{}); ex.Text() != "42" || ex.ExecutionCount != 2 {
		t.Fatalf("x: %+v", ex)
	}

	// A separate context does not share it.
	c, err := sb.CreateCodeContext(ctx, "python", "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	ex := runCode("import os\nprint(os.getcwd())\nx", agentbox.CodeOptions{Context: c.ID})
	if ex.Error == nil || ex.Error.Name != "NameError" || ex.Stdout != "/tmp\n" {
		t.Fatalf("x in another context: %+v", ex)
	}
	ctxs, err := sb.CodeContexts(ctx)
	if err != nil || len(ctxs) != 2 {
		t.Fatalf("contexts: %+v, %v", ctxs, err)
	}

	// An exception: name, value, traceback.
	ex = runCode("def f():\n    raise ValueError('no good')\nf()", agentbox.CodeOptions{})
	if ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "no good" || !strings.Contains(ex.Error.Traceback, "in f") {
		t.Fatalf("exception: %+v", ex.Error)
	}

	// A matplotlib figure comes back as a PNG.
	ex = runCode("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()", agentbox.CodeOptions{})
	var png []byte
	for _, r := range ex.Results {
		if r.PNG != "" {
			png, _ = base64.StdEncoding.DecodeString(r.PNG)
		}
	}
	if len(png) < 8 || string(png[:8]) != "\x89PNG\r\n\x1a\n" {
		t.Fatalf("plot: no PNG in %d results (error %+v)", len(ex.Results), ex.Error)
	}

	// A DataFrame comes back as HTML.
	ex = runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})", agentbox.CodeOptions{})
	if len(ex.Results) != 1 || !strings.Contains(ex.Results[0].HTML, "<table") || !ex.Results[0].IsMainResult {
		t.Fatalf("DataFrame: %+v", ex)
	}

	// Stdout streams before the cell ends.
	var early, end time.Time
	runCode("import time\nprint('early', flush=True)\ntime.sleep(2)\nprint('late')", agentbox.CodeOptions{OnEvent: func(ev api.CodeEvent) {
		if ev.Type == api.CodeEventStdout && strings.Contains(ev.Text, "early") {
			early = time.Now()
		}
		if ev.Type == api.CodeEventEndOfExecution {
			end = time.Now()
		}
	}})
	if early.IsZero() || end.Sub(early) < time.Second {
		t.Fatalf("stdout did not stream: early at %v, end at %v", early, end)
	}

	// A timeout interrupts the cell; the context keeps its state.
	start := time.Now()
	ex = runCode("import time\nwhile True:\n    time.sleep(0.1)", agentbox.CodeOptions{Timeout: 1})
	if ex.Error == nil || ex.Error.Name != "TimeoutError" || time.Since(start) > 30*time.Second {
		t.Fatalf("timeout: %+v after %v", ex.Error, time.Since(start))
	}
	if ex := runCode("x + 1", agentbox.CodeOptions{}); ex.Text() != "43" {
		t.Fatalf("after the timeout: %+v", ex)
	}

	// bash and JavaScript contexts.
	if ex := runCode("N=5; echo $((N*2))", agentbox.CodeOptions{Language: "bash"}); ex.Stdout != "10\n" {
		t.Fatalf("bash: %+v", ex)
	}
	if ex := runCode("const o = {n: 6*7}; o", agentbox.CodeOptions{Language: "javascript"}); string(ex.Results[0].JSON) != `{"n":42}` {
		t.Fatalf("javascript: %+v", ex)
	}

	// Restart and delete.
	if err := sb.RestartCodeContext(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if err := sb.DeleteCodeContext(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.RunCode(ctx, "1", agentbox.CodeOptions{Context: c.ID}); !agentbox.IsNotFound(err) {
		t.Fatalf("deleted context: %v", err)
	}

	// Each code call is a run of the pipeline, recorded as such.
	runs, err := d.client.Runs(ctx, agentbox.RunQuery{Sandbox: sb.ID(), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var codeRuns int
	for _, r := range runs {
		if len(r.Cmd) > 2 && r.Cmd[0] == "/.agentbox/agentbox" && r.Cmd[2] == "code-client" && r.Trigger == api.TriggerAPI {
			codeRuns++
		}
	}
	if codeRuns < 12 {
		t.Fatalf("%d code runs recorded of %d runs", codeRuns, len(runs))
	}

	// The CLI: text out, PNGs saved.
	dir := t.TempDir()
	cmd := exec.Command(agentboxBin(t), "code", sb.ID(), "--png-dir", dir, "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('cli', 6*7)")
	cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "cli 42") {
		t.Fatalf("agentbox code: %v\n%s", err, out)
	}
	pngs, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	if len(pngs) != 1 {
		t.Fatalf("agentbox code --png-dir: %v\n%s", pngs, out)
	}
	cmd = exec.Command(agentboxBin(t), "code", sb.ID(), "1/0")
	cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ZeroDivisionError") {
		t.Fatalf("agentbox code 1/0: %v\n%s", err, out)
	}
}

// testCodeInterpreterE2B: with E2B_API_URL and E2B_SANDBOX_URL pointing at
// `agentbox serve --e2b`, the real @e2b/code-interpreter SDK (pinned in
// test/codeclient) creates a sandbox of its default template
// (code-interpreter-v1, mapped to the builtin code-interpreter) and runs
// code on port 49999 (test/codeclient/e2b.mjs). The code server was
// started through the execute path: a run of trigger e2b, as the user
// "user".
func testCodeInterpreterE2B(t *testing.T, d *daemon, base, e2bURL string) {
	dir := npmClientDir(t, "codeclient", "client.mjs", "e2b.mjs")
	a, key := tenantClient(t, d, base, "code-e2b", api.Quotas{}, api.ScopeFull)
	cmd := exec.Command("node", "e2b.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+e2bURL, "E2B_SANDBOX_URL="+e2bURL, "E2B_API_KEY="+key.Key)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("code-interpreter SDK through the E2B front door: %v\nstdout: %s\nstderr: %s", err, tail(stdout.String(), 2000), tail(stderr.String(), 4000))
	}
	var res struct{ Sandbox string }
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Sandbox == "" {
		t.Fatalf("no result line: %q (%v)", stdout.String(), err)
	}
	ctx := context.Background()
	sb, err := a.Get(ctx, res.Sandbox)
	if err != nil || sb.Info().Template != "code-interpreter" {
		t.Fatalf("the SDK's sandbox: %v, want template code-interpreter", err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	runs, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: res.Sandbox, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var starts int
	for _, r := range runs {
		if len(r.Cmd) == 4 && r.Cmd[2] == "code-client" && r.Cmd[3] == "start" {
			starts++
			if r.Trigger != api.TriggerE2B || r.Tenant != "code-e2b" || r.Who != "e2b-envd:tenant:code-e2b" {
				t.Errorf("code server start: trigger %q tenant %q who %q", r.Trigger, r.Tenant, r.Who)
			}
		}
	}
	if starts != 1 {
		t.Errorf("code server starts: %d, want 1, in %+v", starts, runs)
	}
}
