package inproc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest/lineguest"
)

// lineGuest serves the conformance suite's line protocol in-process.
func lineGuest(ctx context.Context, ln net.Listener, env GuestEnv) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var vars []string
	for k, v := range env.Env {
		vars = append(vars, k+"="+v)
	}
	err := lineguest.Serve(ln, lineguest.Options{Dir: env.Dir, Env: vars})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// runnerDir is a runner directory with a placeholder guest binary: the
// backend checks it is there, and serves its guest in-process.
func runnerDir(t testing.TB) string {
	t.Helper()
	d := runtimetest.TempDir(t)
	if err := os.WriteFile(filepath.Join(d, "agentbox"), []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Fixture{
		NewBackend: func(t *testing.T) runtime.Backend { return New(Config{Guest: lineGuest}) },
		Layer:      runtimetest.TempDir(t),
		RunnerDir:  runnerDir(t),
		Leftovers: func(t *testing.T, id string) []string {
			var out []string
			for _, pid := range Processes(id) {
				out = append(out, "process "+strconv.Itoa(pid))
			}
			return out
		},
	})
}

// spec returns a spec in a fresh temp dir, without root: no chown.
func spec(t *testing.T, id string) runtime.Spec {
	t.Helper()
	base, err := os.MkdirTemp("", "abip") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	for _, d := range []string{"layer", "upper", "work"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return runtime.Spec{
		ID: id, Layers: []string{filepath.Join(base, "layer")},
		UpperDir: filepath.Join(base, "upper"), WorkDir: filepath.Join(base, "work"),
		RunnerDir: runnerDir(t), SocketPath: filepath.Join(base, "g.sock"), StateDir: filepath.Join(base, "state"),
	}
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func run(t *testing.T, c *client.Client, cmd string) (string, int) {
	t.Helper()
	s, err := c.Exec(tctx(t), api.ExecRequest{Command: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	defer s.Close()
	var out bytes.Buffer
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("exec %q: no exit event", cmd)
		}
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			out.Write(ev.Data)
		case api.EventExit:
			return out.String(), *ev.ExitCode
		case api.EventError:
			t.Fatalf("exec %q: %s", cmd, ev.Error)
		}
	}
}

// The default guest is the real guest.Serve, embedded: several run in one
// process beside os/exec, each sandbox's processes carry its marker, and
// Destroy kills even the ones that left their session.
func TestRealGuest(t *testing.T) {
	b := New(Config{Version: "v-test"})
	var sbs []runtime.Sandbox
	var clients []*client.Client
	for _, id := range []string{"real-a", "real-b"} {
		sb, err := b.Create(tctx(t), spec(t, id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Destroy(context.Background()) })
		sbs = append(sbs, sb)
		clients = append(clients, client.New(sb.SocketPath()))
	}
	if v, err := clients[0].Version(tctx(t)); err != nil || v != "v-test" {
		t.Fatalf("Version = %q, %v", v, err)
	}
	if out, code := run(t, clients[1], "echo $"+MarkerEnv+"; exit 4"); code != 4 || !strings.HasSuffix(out, ":real-b\n") {
		t.Fatalf("exec = %q, %d", out, code)
	}
	run(t, clients[0], "setsid sh -c 'sleep 1000 & sleep 1000 &' >/dev/null 2>&1")
	// Both sleeps are forked before the shell exits; a scan may catch one
	// between its fork and its exec, so look until both are seen.
	for deadline := time.Now().Add(10 * time.Second); len(Processes("real-a")) != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("processes of real-a: %v, want 2", Processes("real-a"))
		}
	}
	if _, err := b.Create(tctx(t), spec(t, "real-a")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second Create(real-a) = %v, want ErrAlreadyExists", err)
	}
	if err := sbs[0].Destroy(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if p := Processes("real-a"); len(p) != 0 {
		t.Fatalf("processes left after Destroy: %v", p)
	}
	if st, _ := sbs[0].Status(tctx(t)); st != runtime.StatusStopped {
		t.Fatalf("Status after Destroy = %s", st)
	}
	if out, _ := run(t, clients[1], "echo alive"); out != "alive\n" {
		t.Fatalf("other sandbox after destroy: %q", out)
	}
}

// Pause holds new connections and stops the sandbox's processes; Resume
// serves the held connection.
func TestPauseHoldsConnections(t *testing.T) {
	b := New(Config{})
	sb, err := b.Create(tctx(t), spec(t, "pause-a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	c := client.New(sb.SocketPath())
	run(t, c, "sleep 1000 >/dev/null 2>&1 &")
	p := sb.(runtime.Pauser)
	if err := p.Pause(tctx(t)); err != nil {
		t.Fatal(err)
	}
	st, err := sb.(runtime.StatsReader).Stats(tctx(t))
	if err != nil || st.Pids != 2 {
		t.Fatalf("Stats = %+v, %v; want 2 pids (guest and sleep)", st, err)
	}
	for _, pid := range Processes("pause-a") {
		if s := procState(pid); s != "T" {
			t.Errorf("process %d in state %s while paused, want T", pid, s)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Version(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("paused guest answered (%v)", err)
	default:
	}
	if err := p.Resume(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("held call after resume: %v", err)
	}
	if err := p.Pause(tctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(tctx(t)); err != nil {
		t.Fatalf("Destroy paused: %v", err)
	}
	if p := Processes("pause-a"); len(p) != 0 {
		t.Fatalf("processes left: %v", p)
	}
}

// Recover finds a guest of this process by its state; Cleanup of an
// unknown sandbox removes its files.
func TestRecoverAndCleanup(t *testing.T) {
	sp := spec(t, "rec-a")
	sb, err := New(Config{}).Create(tctx(t), sp)
	if err != nil {
		t.Fatal(err)
	}
	b2 := New(Config{})
	sb2, err := b2.Recover(tctx(t), sp, sb.State())
	if err != nil || sb2 != sb {
		t.Fatalf("Recover = %v, %v", sb2, err)
	}
	if err := b2.Cleanup(tctx(t), sp); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Recover(tctx(t), sp, sb.State()); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover after Cleanup = %v", err)
	}
	if err := os.MkdirAll(sp.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := b2.Cleanup(tctx(t), sp); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sp.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir after Cleanup: %v", err)
	}
}

// The default guest serves the sandbox's UpperDir as "/": no client path
// reaches the host's file of that name.
func TestGuestRootIsUpperDir(t *testing.T) {
	sp := spec(t, "root-a")
	sb, err := New(Config{}).Create(tctx(t), sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	c := client.New(sb.SocketPath())
	name := "/etc/inproc-root-test-" + strconv.Itoa(os.Getpid())
	fi, err := c.WriteFile(tctx(t), name, 0o600, true, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Path != name {
		t.Errorf("WriteFile reports path %q, want %q", fi.Path, name)
	}
	if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the host's %s was written (%v)", name, err)
	}
	if b, err := os.ReadFile(filepath.Join(sp.UpperDir, name)); err != nil || string(b) != "x" {
		t.Fatalf("upper dir file = %q, %v", b, err)
	}
	l, err := c.List(tctx(t), "/etc")
	if err != nil || len(l) != 1 || l[0].Path != name {
		t.Fatalf("List(/etc) = %+v, %v", l, err)
	}
	if out, code := run(t, c, "pwd"); code != 0 || out != sp.UpperDir+"\n" {
		t.Fatalf("pwd = %q, %d; want the upper dir", out, code)
	}
	if err := c.Remove(tctx(t), "/", true); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Remove(/) = %v, want invalid argument", err)
	}
	if _, err := c.Mkdir(tctx(t), api.MkdirRequest{Path: "/a/b", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(tctx(t), api.MoveRequest{From: "/a", To: "/c"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(sp.UpperDir, "c", "b")); err != nil || !fi.IsDir() {
		t.Fatalf("moved dir: %v", err)
	}
}
