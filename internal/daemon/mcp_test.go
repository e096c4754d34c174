package daemon_test

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The daemon's /mcp on the unix socket, reached through the Go SDK's
// MCPEndpoint: tool calls act on the daemon's sandboxes, and a command run
// through sandbox_exec is a run record of trigger mcp.
func TestMCPInproc(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresFile(t, "/bin/busybox", "package busybox-static")
	td := startDaemon(t, testConfig(t))
	t.Cleanup(func() {
		sandboxtest.DestroyAll(context.Background(), td.d.Manager())
		td.d.Close()
	})
	ctx := tctx(t)
	endpoint, hc := td.c.MCPEndpoint()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(name string, args map[string]any) map[string]any {
		t.Helper()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || r.IsError {
			t.Fatalf("%s: %v %+v", name, err, r)
		}
		return r.StructuredContent.(map[string]any)
	}
	id := call("sandbox_create", nil)["id"].(string)
	if out := call("sandbox_exec", map[string]any{"sandbox": id, "command": "echo hi"}); out["stdout"] != "hi\n" || out["exit_code"] != float64(0) {
		t.Fatalf("sandbox_exec = %v", out)
	}
	call("file_write", map[string]any{"sandbox": id, "path": "/etc/greeting", "content": "hello"})
	ck := call("checkpoint_create", map[string]any{"sandbox": id})["id"].(string)
	call("file_write", map[string]any{"sandbox": id, "path": "/etc/greeting", "content": "changed"})
	if d := call("sandbox_diff", map[string]any{"from": "checkpoint:" + ck, "to": "sandbox:" + id})["diff"].(map[string]any); d["modified"] != float64(1) {
		t.Errorf("sandbox_diff = %v, want one modified file", d)
	}
	forks := call("sandbox_fork", map[string]any{"sandbox": id})["sandboxes"].([]any)
	if len(forks) != 1 {
		t.Fatalf("sandbox_fork = %v", forks)
	}
	fork := forks[0].(map[string]any)["id"].(string)
	if out := call("file_read", map[string]any{"sandbox": fork, "path": "/etc/greeting"}); out["content"] != "changed" {
		t.Errorf("fork's greeting = %v", out)
	}
	runs, err := td.c.Runs(ctx, agentbox.RunQuery{Sandbox: id})
	if err != nil || len(runs) != 1 || runs[0].Trigger != api.TriggerMCP || runs[0].Who != "unix-socket" {
		t.Fatalf("runs = %+v, %v; want one of trigger mcp by unix-socket", runs, err)
	}
}
