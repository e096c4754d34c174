package identity

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// TestDeps keeps identity a leaf: the core, the warm pool and the
// snapshot feature all import it, so it imports none of the module.
func TestDeps(t *testing.T) {
	deptest.CheckDirectAllowed(t, deptest.Module+"/internal/identity", nil,
		"identity is the leaf table the core and its features share; it imports nothing of the module")
}
