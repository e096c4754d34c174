package e2b

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The E2B front end reaches sandboxes only through its Sandboxes
// interface, which the daemon implements with the same service as the
// HTTP API: one execute path, one tenancy.
func TestDeps(t *testing.T) {
	m := deptest.Module + "/internal/"
	deptest.Check(t, deptest.Module+"/internal/e2b", []deptest.Rule{
		{Path: m + "sandbox", Reason: "sandboxes are reached only through Sandboxes (the daemon wires its service in)"},
		{Path: m + "pipeline", Reason: "commands reach the pipeline through Sandboxes.Exec, which records trigger e2b"},
		{Path: m + "daemon", Reason: "the daemon composes the E2B front end, not the other way round"},
		{Path: m + "httpapi", Reason: "agentbox's API edge is a sibling front end, not a dependency"},
		{Path: m + "store", Reason: "no persistence of its own: metadata are labels, snapshots checkpoints"},
		{Path: m + "runtime", Reason: "isolation backends are the sandbox core's business"},
		{Path: m + "guest", Reason: "the guest is reached through Sandboxes"},
	})
}
