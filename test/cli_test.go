package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestRunWithEmbeddedDaemon: `agentbox run --rm` on a box with no daemon
// starts one in-process, streams the command's output, exits with its code
// and leaves no sandbox behind.
func TestRunWithEmbeddedDaemon(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := os.Stat("/run/agentbox/agentbox.sock"); err == nil {
		testutil.NotApplicable(t, "a daemon listens on the default socket; the embedded fallback would not be used")
	}
	dir := filepath.Join("/tmp", "abx-run-"+randHex(4))
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dataDir := filepath.Join(dir, "data")
	cmd := exec.Command(agentboxBin(t), "run", "--rm", "--", "sh", "-c", "echo out; echo err >&2; hostname > /dev/null; exit 3")
	cmd.Env = append(os.Environ(), "AGENTBOX_DATA_DIR="+dataDir, "AGENTBOX_SOCKET="+filepath.Join(dir, "run", "agentbox.sock"),
		"AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(dir, "secrets.key"))
	cmd.Env = withoutEnv(cmd.Env, "AGENTBOX_HOST")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("run: %v (want exit 3)\nstdout %q\nstderr %q", err, stdout.String(), stderr.String())
	}
	if stdout.String() != "out\n" || !strings.Contains(stderr.String(), "err\n") {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	entries, err := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("sandbox %s left behind by run --rm", e.Name())
			if dirs := cgroupDirs(e.Name()); len(dirs) != 0 {
				t.Errorf("its cgroups are left too: %v", dirs)
			}
		}
	}
}

// TestGracefulRestartKeepsSandboxes: SIGTERM stops the daemon, not its
// sandboxes; the next daemon re-adopts them with their processes intact.
func TestGracefulRestartKeepsSandboxes(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
	pid := strings.TrimSpace(mustRun(t, sb, "cat /tmp/sleeper"))
	d.restart(syscall.SIGTERM)
	got, err := d.client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatalf("sandbox after graceful restart: %v", err)
	}
	if got.Info().State != "running" {
		t.Fatalf("state after restart: %s", got.Info().State)
	}
	if out := mustRun(t, sb, "kill -0 "+pid+" && echo alive"); strings.TrimSpace(out) != "alive" {
		t.Fatalf("background process did not survive the restart: %q", out)
	}
	// The re-adopted sandbox is deleted normally.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := sb.Delete(dctx); err != nil {
		t.Fatal(err)
	}
	if left := sandboxPids(t, sb.ID()); len(left) != 0 {
		t.Fatalf("processes left after deleting a re-adopted sandbox: %v", left)
	}
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
