package guest

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The guest runs inside every sandbox, as its PID 1, on a connection the
// sandbox's user can reach: it speaks only the guest protocol and trusts
// nothing of the host's. It links none of the daemon's packages, so no host
// code (secrets, the store, other sandboxes' state) is reachable from its
// binary's paths, and the protocol stays the one contract between them.
func TestDeps(t *testing.T) {
	const why = "the guest (in-sandbox, untrusted side) links no host package; talk to the host only through internal/guest/proto"
	var rules []deptest.Rule
	for _, p := range []string{
		"daemon", "sandbox", "runtime", "layers", "templates", "store",
		"httpapi", "tenant", "secrets", "egress", "bridge", "pipeline", "config",
		"diskquota", "idrange", "oci", "runner", "runsecrets", "sandboxevents", "sandboxnet", "tunnel", "snapshot",
	} {
		rules = append(rules, deptest.Rule{Path: deptest.Module + "/internal/" + p, Reason: why})
	}
	deptest.Check(t, deptest.Module+"/internal/guest/...", rules)
}
