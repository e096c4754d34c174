package httpapi

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The HTTP edge decodes, authenticates and maps errors to status; what it
// serves comes through the Service interface the daemon implements.
func TestDeps(t *testing.T) {
	m := deptest.Module + "/internal/"
	deptest.Check(t, deptest.Module+"/internal/httpapi", []deptest.Rule{
		{Path: m + "sandbox", Reason: "the API reaches sandboxes only through its Service interface (the daemon wires the Manager in)"},
		{Path: m + "store", Reason: "the API never touches persistence: records reach it as api types through Service"},
		{Path: m + "daemon", Reason: "the daemon composes the API, not the other way round"},
		{Path: m + "runtime", Reason: "isolation backends are the sandbox core's business"},
		{Path: m + "layers", Reason: "storage is reached through Service"},
		{Path: m + "templates", Reason: "templates are reached through Service"},
		{Path: m + "pipeline", Reason: "runs are reached through Service"},
	})
}
