package test

import (
	"encoding/json"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestCodeServerE2BSDK: the code server (`agentbox guest code-server`,
// here on the host with the host's python3 and bash) speaks E2B's
// code-interpreter protocol as the real @e2b/code-interpreter SDK
// (pinned in test/codeclient) expects it: runCode with state, the
// onResult/onStdout/onError callbacks, the main result's text and JSON,
// an ExecutionError, contexts (create, list, restart, remove), an unknown
// context as the SDK's NotFoundError, and a bash cell. What reaches the
// server through the E2B front door (E2b-Sandbox-Port 49999) is this.
func TestCodeServerE2BSDK(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	testutil.RequiresBinary(t, "bash")
	dir := npmClientDir(t, "codeclient", "client.mjs")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := exec.Command(agentboxBin(t), "guest", "code-server", "--addr", addr)
	srv.Dir = t.TempDir()
	var srvLog strings.Builder
	srv.Stdout, srv.Stderr = &srvLog, &srvLog
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("code server did not answer: %v\n%s", err, srvLog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	cmd := exec.Command("node", "client.mjs", "http://"+addr)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("client: %v\n%s\n%s\nserver:\n%s", err, out, stderr, srvLog.String())
	}
	var got struct {
		Text              string
		ExecutionCount    int
		OnResult          int
		Streamed          []string
		Logs              struct{ Stdout, Stderr []string }
		JSON              map[string]int
		OnError           string
		Error             struct{ Name, Value, Traceback string }
		Context           struct{ ID, Language, Cwd string }
		OtherContextError string
		Contexts          int
		Removed           string
		Bash              string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Text != "42" || got.ExecutionCount != 2 || got.OnResult != 1 {
		t.Errorf("runCode('x'): text %q, count %d, onResult %d", got.Text, got.ExecutionCount, got.OnResult)
	}
	if strings.Join(got.Streamed, "") != "out\n" || strings.Join(got.Logs.Stdout, "") != "out\n" || got.JSON["a"] != 1 {
		t.Errorf("stdout and JSON: %+v", got)
	}
	if got.OnError != "ZeroDivisionError" || got.Error.Name != "ZeroDivisionError" || got.Error.Value != "division by zero" || !strings.Contains(got.Error.Traceback, "1/0") {
		t.Errorf("error: %q %+v", got.OnError, got.Error)
	}
	if got.Context.ID == "" || got.Context.Language != "python" || got.Context.Cwd != "/tmp" || got.OtherContextError != "NameError" || got.Contexts != 2 {
		t.Errorf("contexts: %+v", got)
	}
	if got.Removed != "NotFoundError" || got.Bash != "5\n" {
		t.Errorf("removed context: %q, bash %q", got.Removed, got.Bash)
	}
}
