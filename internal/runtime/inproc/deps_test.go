package inproc

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// The in-process backend isolates nothing: no binary may build it in, so a
// daemon can only ever get it from a test (daemon Options).
func TestNotInTheBinary(t *testing.T) {
	goBin := testutil.RequiresBinary(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "github.com/agentbox/agentbox/cmd/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/agentbox/agentbox/internal/runtime/inproc" {
			t.Fatal("a command imports internal/runtime/inproc, a backend for tests only")
		}
	}
}
