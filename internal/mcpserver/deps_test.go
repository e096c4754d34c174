package mcpserver

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The MCP front end reaches sandboxes only through its Sandboxes
// interface, which the daemon implements with the same service as the
// HTTP API: one execute path, one tenancy.
func TestDeps(t *testing.T) {
	m := deptest.Module + "/internal/"
	deptest.Check(t, deptest.Module+"/internal/mcpserver", []deptest.Rule{
		{Path: m + "sandbox", Reason: "tools reach sandboxes only through Sandboxes (the daemon wires its service in)"},
		{Path: m + "pipeline", Reason: "commands reach the pipeline through Sandboxes.Exec, which records trigger mcp"},
		{Path: m + "daemon", Reason: "the daemon composes the MCP server, not the other way round"},
		{Path: m + "httpapi", Reason: "authentication is the API edge's, which mounts Handler; tools never see HTTP auth"},
		{Path: m + "store", Reason: "no persistence of its own"},
		{Path: m + "runtime", Reason: "isolation backends are the sandbox core's business"},
	})
}
