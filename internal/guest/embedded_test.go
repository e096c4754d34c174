package guest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest"
)

// Embedded guests wait only for their own children: two serve one process
// side by side, each reporting its own exit codes, while os/exec in the
// same process still gets its child's status; Env reaches every process
// unless the request sets the variable.
func TestEmbeddedGuests(t *testing.T) {
	a, _ := startGuest(t, guest.Options{Embedded: true, Env: map[string]string{"WHO": "a"}})
	b, _ := startGuest(t, guest.Options{Embedded: true, Env: map[string]string{"WHO": "b"}})
	for i := range 5 {
		ra := run(t, a, api.ExecRequest{Command: "echo $WHO; exit 3"})
		rb := run(t, b, api.ExecRequest{Command: "echo $WHO; exit 4"})
		if exitCode(t, ra) != 3 || ra.stdout != "a\n" || exitCode(t, rb) != 4 || rb.stdout != "b\n" {
			t.Fatalf("round %d: a = %+v, b = %+v", i, ra, rb)
		}
		if err := exec.Command("/bin/sh", "-c", "exit 0").Run(); err != nil {
			t.Fatalf("round %d: os/exec beside embedded guests: %v", i, err)
		}
	}
	r := run(t, a, api.ExecRequest{Command: "echo $WHO", Env: map[string]string{"WHO": "request"}})
	if strings.TrimSpace(r.stdout) != "request" {
		t.Fatalf("the request's variable lost to Options.Env: %q", r.stdout)
	}
}
