package native

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestOnGuestThread: a process forked by onGuestThread starts with the
// guest's limits, and no thread of ours keeps them afterwards.
func TestOnGuestThread(t *testing.T) {
	testutil.RequiresRoot(t)
	cat := testutil.RequiresBinary(t, "cat")
	want := map[string]string{
		"CapBnd":     fmt.Sprintf("%016x", nsinit.StartCapMask()),
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
	}
	// Several times: the goroutine lands on the main thread now and then
	// (the first try did, before forkLimited moved off it).
	for range 20 {
		var out strings.Builder
		cmd := exec.Command(cat, "/proc/self/status")
		cmd.Stdout = &out
		if err := onGuestThread(cmd.Start); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		st := statusFields(out.String())
		for k, v := range want {
			if st[k] != v {
				t.Fatalf("child %s = %q, want %q", k, st[k], v)
			}
		}
	}

	// The forking threads went with their goroutines, and the main thread
	// (which the runtime would have parked for good) was not one of them:
	// every thread left has the bounding set the process started with.
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	full := statusFields(string(self))["CapBnd"]
	if full == want["CapBnd"] {
		t.Fatalf("test process already has the guest's bounding set %s", full)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended meanwhile
		}
		if st := statusFields(string(b)); st["CapBnd"] != full || st["NoNewPrivs"] != "0" {
			t.Errorf("%s: CapBnd %s NoNewPrivs %s after onGuestThread; want %s and 0", f, st["CapBnd"], st["NoNewPrivs"], full)
		}
	}
}
