package untar

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// untar runs inside every sandbox (the guest's archive upload), so it may
// import only the standard library, x/sys and agentbox's own leaves: the
// guest imports no host package.
func TestDeps(t *testing.T) {
	deptest.CheckOnly(t, deptest.Module+"/internal/untar", []deptest.Rule{
		{Path: deptest.Module + "/internal/errdefs", Exact: true, Reason: "error categories"},
		{Path: deptest.Module + "/internal/tarcheck", Exact: true, Reason: "header rules"},
		{Path: "golang.org/x/sys", Reason: "system calls beneath the extraction root"},
	})
}
