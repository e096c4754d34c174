package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

// TestCreateRuntimeFlag: create --runtime sends the backend's name; a
// refused one exits with the daemon's message; info lists the runtimes.
func TestCreateRuntimeFlag(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	var created api.Sandbox
	if err := json.Unmarshal([]byte(mustCLI(t, srv, "create", "--runtime", "fake", "--json")), &created); err != nil || created.Backend != "fake" {
		t.Fatalf("create --runtime fake = %+v, %v", created, err)
	}
	_, errOut, code := cli(t, srv, "", "create", "--runtime", "nosuch")
	if code != exitAgentbox || !strings.Contains(errOut, `runtime "nosuch": no such backend (this daemon runs fake)`) {
		t.Fatalf("create --runtime nosuch: exit %d, %q", code, errOut)
	}
	if len(srv.SandboxIDs()) != 1 {
		t.Errorf("sandboxes %v, want the one created", srv.SandboxIDs())
	}
	if out := mustCLI(t, srv, "info"); !strings.Contains(out, "Runtime fake:") || !strings.Contains(out, "default") {
		t.Errorf("info does not list the runtimes:\n%s", out)
	}
}
