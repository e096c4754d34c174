package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestAdversarialTwoDaemonsRefusedLeavesNoMount: a daemon refused at
// start-up after it bind-mounted its sandboxes dir nosuid,nodev (here: on
// a cgroup parent another daemon holds) takes that mount back, so a host
// where daemons are refused does not collect empty mounts.
func TestAdversarialTwoDaemonsRefusedLeavesNoMount(t *testing.T) {
	testutil.RequiresRoot(t)
	parent := "abx-refused-" + randHex(4)
	t.Setenv("AGENTBOX_CGROUP_PARENT", parent)
	t.Cleanup(func() { removeCgroupParent(t, parent) })
	newDaemon(t) // holds the parent
	dir := privateDir(t)
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentboxBin(t), "serve", "--data-dir", data, "--socket", filepath.Join(dir, "s.sock"))
	cmd.Env = append(os.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(dir, "secrets.key"))
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "owned by another agentbox daemon") {
		t.Fatalf("a second daemon on cgroup parent %s was not refused (err %v):\n%s", parent, err, out)
	}
	// It got as far as the mount: its sandboxes dir exists.
	if _, err := os.Stat(filepath.Join(data, "sandboxes")); err != nil {
		t.Fatalf("the refused daemon never reached its sandboxes dir: %v\n%s", err, out)
	}
	if m := hostMountsContaining(t, data); len(m) > 0 {
		t.Errorf("the refused daemon left mounts under its data dir %s:\n%s", data, strings.Join(m, "\n"))
	}
}
