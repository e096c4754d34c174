package daemon_test

// A whole daemon on the in-process backend (internal/runtime/inproc),
// driven through the Go SDK over its unix socket: the composition root,
// the HTTP API and the Manager together, with no namespaces. It needs root
// for what the daemon does to its data dir whatever the backend (the
// sandboxes dir's nosuid,nodev bind mount).

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/daemon"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func TestMain(m *testing.M) {
	code := m.Run()
	runtimetest.RemoveBuildCache()
	os.Exit(code)
}

type testDaemon struct {
	cfg *config.Config
	d   *daemon.Daemon
	c   *agentbox.Client
}

// startDaemon starts a daemon whose only working backend is the
// in-process one (native may start beside it; it is not the default).
func startDaemon(t *testing.T, cfg *config.Config) *testDaemon {
	t.Helper()
	ctx := context.Background()
	d, err := daemon.New(ctx, cfg, daemon.Options{
		GuestBinary: runtimetest.TestGuestBinary(t), // any static binary: the in-process backend never runs it
		Logger:      slog.New(slog.DiscardHandler),
		Backends:    []runtime.Backend{inproc.New(inproc.Config{Version: "inproc-guest"})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		d.Close()
		t.Fatal(err)
	}
	c, err := agentbox.New(agentbox.WithHost("unix://" + cfg.SocketPath))
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	return &testDaemon{cfg: cfg, d: d, c: c}
}

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	dir := t.TempDir()
	run, err := os.MkdirTemp("", "abxd") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	cfg := config.Default()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.SocketPath = filepath.Join(run, "agentbox.sock")
	cfg.SecretsKeyFile = filepath.Join(dir, "secrets.key")
	cfg.Runtime = inproc.Name
	cfg.DefaultResources.DiskBytes, cfg.DefaultResources.DiskInodes = 0, 0 // no per-sandbox disk images
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	return cfg
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDaemonInproc(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresFile(t, "/bin/busybox", "package busybox-static")
	cfg := testConfig(t)
	td := startDaemon(t, cfg)
	closed := false
	t.Cleanup(func() {
		if !closed {
			sandboxtest.DestroyAll(context.Background(), td.d.Manager())
			td.d.Close()
		}
	})
	ctx := tctx(t)
	c := td.c

	info, err := c.Info(ctx)
	if err != nil || info.Backend != inproc.Name {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Labels: map[string]string{"suite": "daemon"}, Env: map[string]string{"A": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(ctx, "echo $A; echo oops >&2; exit 2")
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "b\n" || string(res.Stderr) != "oops\n" || res.ExitCode != 2 {
		t.Fatalf("Run = %+v", res)
	}
	if err := sb.WriteFile(ctx, "/etc/greeting", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "/etc/greeting"); err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	if l, err := sb.ListDir(ctx, "/etc"); err != nil || len(l) == 0 {
		t.Fatalf("ListDir = %+v, %v", l, err)
	}
	ck, err := sb.Checkpoint(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/etc/greeting", []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := c.Diff(ctx, "checkpoint:"+ck.ID, "sandbox:"+sb.ID(), true)
	if err != nil || d.Modified != 1 {
		t.Fatalf("Diff = %+v, %v", d, err)
	}
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "/etc/greeting"); err != nil || string(b) != "hello" {
		t.Fatalf("after restore = %q, %v", b, err)
	}
	forks, err := sb.Fork(ctx, 1)
	if err != nil || len(forks) != 1 {
		t.Fatalf("Fork = %v, %v", forks, err)
	}
	if b, err := forks[0].ReadFile(ctx, "/etc/greeting"); err != nil || string(b) != "hello" {
		t.Fatalf("fork's greeting = %q, %v", b, err)
	}
	p, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := sb.Processes(ctx); err != nil || len(ps) == 0 {
		t.Fatalf("Processes = %+v, %v", ps, err)
	}
	if err := p.Signal(ctx, "KILL"); err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if tr, err := sb.Transitions(ctx); err != nil || len(tr) < 3 {
		t.Fatalf("Transitions = %+v, %v", tr, err)
	}
	if l, err := c.List(ctx, map[string]string{"suite": "daemon"}); err != nil || len(l) != 1 {
		t.Fatalf("List = %v, %v", l, err)
	}
	if ts, err := c.Templates(ctx); err != nil || len(ts) == 0 {
		t.Fatalf("Templates = %+v, %v", ts, err)
	}
	rc, err := c.ExportCheckpoint(ctx, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, rc)
	rc.Close()
	if n == 0 {
		t.Fatal("empty checkpoint export")
	}
	if _, err := c.SetSecret(ctx, "token", []byte("s3cret")); err != nil {
		t.Fatal(err)
	}
	res, err = sb.Exec(ctx, api.ExecRequest{Command: "echo $TOKEN", Secrets: []api.ExecSecret{{Name: "token", Env: "TOKEN"}}}, agentbox.Streams{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.Stdout), "s3cret") {
		t.Fatalf("a secret's value reached the output: %q", res.Stdout)
	}
	if _, err := c.Get(ctx, "nosuchsandbox"); !errdefs.IsNotFound(err) && !strings.Contains(err.Error(), "not found") {
		t.Fatalf("Get(unknown) = %v", err)
	}

	// A restart re-adopts the sandbox.
	if err := td.d.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	td = startDaemon(t, cfg)
	closed = false
	sb2, err := td.c.Get(ctx, sb.ID())
	if err != nil || sb2.Info().State != api.StateRunning {
		t.Fatalf("after restart: %+v, %v", sb2, err)
	}
	if res, err := sb2.Run(ctx, "echo again"); err != nil || string(res.Stdout) != "again\n" {
		t.Fatalf("Run after restart = %+v, %v", res, err)
	}
	if err := sb2.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if p := inproc.Processes(sb.ID()); len(p) != 0 {
		t.Fatalf("processes left: %v", p)
	}
}
