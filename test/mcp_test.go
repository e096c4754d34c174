package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// mcpClientDir returns a directory holding test/mcpclient's script and its
// npm dependencies (npmClientDir).
func mcpClientDir(t *testing.T) string {
	t.Helper()
	return npmClientDir(t, "mcpclient", "client.mjs")
}

// npmClientDir returns a directory holding the scripts of test/<name>
// and its npm dependencies, installed with `npm ci` (exactly
// package-lock.json) into a cache outside the clone ($XDG_CACHE_HOME or
// ~/.cache, under agentbox/<name>-<hash of the lock file>), so a fresh CI
// clone installs once per lock file and a changed lock file gets a fresh
// install (scripts/install-deps.sh fills the same cache). A missing node
// or npm, or a failed install (no registry access), skips, or fails
// under AGENTBOX_TEST_STRICT=1.
func npmClientDir(t *testing.T, name string, scripts ...string) string {
	t.Helper()
	testutil.RequiresBinary(t, "node")
	npm := testutil.RequiresBinary(t, "npm")
	src, err := filepath.Abs(name)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "agentbox", name+"-"+hex.EncodeToString(sum[:])[:16])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range append([]string{"package.json", "package-lock.json"}, scripts...) {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	done := filepath.Join(dir, "node_modules", ".agentbox-installed")
	if _, err := os.Stat(done); err == nil {
		return dir
	}
	cmd := exec.Command(npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	testutil.Requires(t, err == nil, "the npm packages of test/"+name+" (npm ci in "+dir+": "+tail(string(out), 800)+")")
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runMCPClient runs client.mjs with args and env and returns the sandbox
// id it reports.
func runMCPClient(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("MCP client %v: %v\nstdout: %s\nstderr: %s", args[0], err, tail(stdout.String(), 2000), tail(stderr.String(), 4000))
	}
	var res struct {
		Sandbox string `json:"sandbox"`
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Sandbox == "" {
		t.Fatalf("MCP client %v: no result line: %q (%v)", args[0], stdout.String(), err)
	}
	return res.Sandbox
}

// TestMCP drives `agentbox mcp` (stdio) and POST /mcp (streamable HTTP on
// loopback TCP, with a tenant's API key) with the official TypeScript MCP
// client (test/mcpclient/client.mjs: tools and schemas, create, exec,
// files, checkpoint and restore, diff, delete; another tenant's sandbox
// refused like an unknown one), then checks that the commands it ran are
// run records of trigger mcp, by that tenant's key.
func TestMCP(t *testing.T) {
	dir := mcpClientDir(t)
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	a, keyA := tenantClient(t, d, base, "mcp-a", api.Quotas{}, api.ScopeFull)
	b, _ := tenantClient(t, d, base, "mcp-b", api.Quotas{}, api.ScopeFull)
	other, err := b.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("tenant B create: %v", err)
	}
	defer other.Delete(context.WithoutCancel(ctx))
	env := []string{"OTHER_SANDBOX=" + other.ID()}

	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"http", []string{"http", base + "/mcp", keyA.Key}, nil},
		{"stdio", []string{"stdio", agentboxBin(t)}, []string{"AGENTBOX_HOST=" + base, "AGENTBOX_API_KEY=" + keyA.Key}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := runMCPClient(t, dir, append(env, tc.env...), tc.args...)
			runs, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: id})
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) < 3 {
				t.Fatalf("runs of sandbox %s: %d, want the client's 3 commands at least: %+v", id, len(runs), runs)
			}
			for _, r := range runs {
				if want := "tenant:mcp-a/key:" + keyA.ID; r.Trigger != api.TriggerMCP || r.Tenant != "mcp-a" || r.Who != want {
					t.Errorf("run %s: trigger %q tenant %q who %q, want trigger mcp by %s", r.ID, r.Trigger, r.Tenant, r.Who, want)
				}
			}
			byTrigger, err := a.Runs(ctx, agentbox.RunQuery{Sandbox: id, Trigger: api.TriggerMCP})
			if err != nil {
				t.Fatal(err)
			}
			if len(byTrigger) != len(runs) {
				t.Errorf("runs?trigger=mcp: %d runs, want %d", len(byTrigger), len(runs))
			}
		})
	}
	// Tenant B's sandbox ran nothing and still runs.
	if runs, err := b.Runs(ctx, agentbox.RunQuery{Sandbox: other.ID()}); err != nil || len(runs) != 0 {
		t.Errorf("tenant B's runs: %v, %v; want none", runs, err)
	}
	if sb, err := b.Get(ctx, other.ID()); err != nil || sb.Info().State != api.StateRunning {
		t.Errorf("tenant B's sandbox after the MCP client: %v; want running", err)
	}
}
