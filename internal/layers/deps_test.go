package layers

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// The layer store is storage: files, trees and their id ownership. It sits
// below everything that runs sandboxes.
func TestDeps(t *testing.T) {
	m := deptest.Module + "/internal/"
	deptest.Check(t, deptest.Module+"/internal/layers", []deptest.Rule{
		{Path: m + "runtime", Reason: "layers know nothing of isolation backends; the id range type is idrange.IDMap"},
		{Path: m + "sandbox", Reason: "the sandbox core uses layers, not the other way round"},
		{Path: m + "templates", Reason: "templates are built from layers, not the other way round"},
		{Path: m + "store", Reason: "layers keep their own metadata beside their files"},
		{Path: m + "daemon", Reason: "the daemon composes the layer store"},
	})
}
