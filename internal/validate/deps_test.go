package validate

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// validate is shared by the daemon and the guest, so it stays a leaf:
// the standard library and agentbox's own leaves only.
func TestDeps(t *testing.T) {
	deptest.CheckOnly(t, deptest.Module+"/internal/validate", []deptest.Rule{
		{Path: deptest.Module + "/internal/errdefs", Exact: true, Reason: "error categories"},
		{Path: deptest.Module + "/internal/lazyregexp", Exact: true, Reason: "patterns compiled on first use"},
	})
}
