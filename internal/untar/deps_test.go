package untar

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// untar runs inside every sandbox (the guest's archive upload), so it may
// import only the standard library, x/sys and agentbox's own leaves: the
// guest imports no host package.
func TestDeps(t *testing.T) {
	goBin := testutil.RequiresBinary(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/agentbox/agentbox/internal/untar":    true,
		"github.com/agentbox/agentbox/internal/errdefs":  true, // error categories
		"github.com/agentbox/agentbox/internal/tarcheck": true, // header rules
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] && !strings.HasPrefix(p, "golang.org/x/sys/") {
			t.Errorf("untar imports %s", p)
		}
	}
}
