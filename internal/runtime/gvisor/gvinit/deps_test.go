package gvinit

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// gvinit runs inside every gVisor sandbox, as the first stage of its PID 1:
// like the guest it links no host package, not even the backend it
// belongs to (internal/runtime/gvisor, which runs runsc as host root).
func TestDeps(t *testing.T) {
	const why = "gvinit (in-sandbox, untrusted side) links no host package"
	rules := []deptest.Rule{
		{Path: deptest.Module + "/internal/runtime/gvisor", Reason: why, Exact: true},
		{Path: deptest.Module + "/internal/runtime/native", Reason: why},
	}
	for _, p := range []string{
		"daemon", "sandbox", "layers", "templates", "store", "httpapi", "tenant", "secrets", "egress",
		"bridge", "pipeline", "config", "diskquota", "oci", "runner", "snapshot", "cleanup",
	} {
		rules = append(rules, deptest.Rule{Path: deptest.Module + "/internal/" + p, Reason: why})
	}
	deptest.Check(t, deptest.Module+"/internal/runtime/gvisor/gvinit", rules)
}
