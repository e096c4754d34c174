package validate

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// validate is shared by the daemon and the guest, so it stays a leaf:
// the standard library and agentbox's own leaves only.
func TestDeps(t *testing.T) {
	goBin := testutil.RequiresBinary(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/agentbox/agentbox/internal/validate":   true,
		"github.com/agentbox/agentbox/internal/errdefs":    true, // error categories
		"github.com/agentbox/agentbox/internal/lazyregexp": true, // patterns compiled on first use
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] {
			t.Errorf("validate imports %s", p)
		}
	}
}
