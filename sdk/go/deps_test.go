package agentbox

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The SDK is imported by programs outside this module, which cannot import
// internal packages; it shares only the public wire types of package api.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Module+"/sdk/go/...", []deptest.Rule{
		{Path: deptest.Module + "/internal", Reason: "the SDK imports nothing internal: outside programs could not build it, and the wire contract is package api"},
	})
}
