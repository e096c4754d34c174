// Package sandboxtest builds a sandbox.Manager for tests, on the in-process
// backend (internal/runtime/inproc): real guests, a real layer store (copy
// driver) and template manager, a template "base" as the default, no root.
// The sandbox core's tests and each feature package's use it; a feature
// attaches to the Manager under test through sandbox.Config.Extensions
// (New's edit functions).
//
// The backend does not isolate: its guest serves the sandbox's writable
// layer (its UpperDir, see Env.Upper) as "/" and runs commands there as
// host processes, so a command line must name no absolute path (it would
// be the host's); what "the sandbox wrote" is put into the upper dir
// (Env.Write) or written through the Manager's file operations.
package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
)

// Env is a Manager under test and what it is built on.
type Env struct {
	T         testing.TB
	M         *sandbox.Manager
	Store     *store.Bolt
	Layers    *layers.Store
	Templates *templates.Manager
	Config    sandbox.Config
	// Base is the layer of template "base": etc/base.txt ("base\n").
	Base    layers.Layer
	Backend *inproc.Backend
	// Others are further backends of the Manager (Backend is its
	// default), e.g. an inproc.Backend under another name; none unless an
	// Option sets them.
	Others []runtime.Backend
}

// Option changes the Manager's Config (Extensions, Clock, ...) before
// the Manager is built; e has its Store, Layers and Templates already.
type Option func(e *Env, c *sandbox.Config)

// New returns an Env whose Manager is built from a Config each option may
// change. Everything is removed when t ends.
func New(t testing.TB, opts ...Option) *Env {
	t.Helper()
	dir := t.TempDir()
	ids := runtime.IDMap{HostID: uint32(os.Getuid()), Size: 1}
	st, err := store.Open(filepath.Join(dir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ls, err := layers.New(filepath.Join(dir, "layers"), ids)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := templates.New(templates.Config{DataDir: filepath.Join(dir, "templates"), Layers: ls, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := ls.TempDir("base-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc", "base.txt"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := ls.CreateFromDir(ctx, src, layers.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tm.Adopt(ctx, "base", base.ID, map[string]string{"FROM_TEMPLATE": "yes"}); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agentbox")
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	runnerDir, err := runner.Install(filepath.Join(dir, "runners"), bin)
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "abxi") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	cfg := sandbox.Config{
		DataDir: filepath.Join(dir, "data"), RunDir: runDir, RunnerDir: runnerDir,
		IDs: ids, DefaultTemplate: "base", Layers: ls, Version: "v-test",
		Logger: slog.New(slog.DiscardHandler),
	}
	e := &Env{T: t, Store: st, Layers: ls, Templates: tm, Base: base, Backend: inproc.New(inproc.Config{Version: "guest-test"})}
	for _, o := range opts {
		o(e, &cfg)
	}
	e.Config = cfg
	e.M = e.Manager()
	return e
}

// Manager returns a new Manager on the Env's store, directories and
// backend, as a restarted daemon builds one (call Recover on it). Its
// sandboxes are deleted when the test ends.
func (e *Env) Manager() *sandbox.Manager {
	e.T.Helper()
	backends, err := runtime.NewRegistry("", append([]runtime.Backend{e.Backend}, e.Others...)...)
	if err != nil {
		e.T.Fatal(err)
	}
	m, err := sandbox.New(e.Config, backends, e.Templates, e.Store)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() {
		_ = DestroyAll(context.Background(), m)
		m.Close()
	})
	return m
}

// Context is a context that ends with t (or after 30 s).
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Create creates a sandbox through the Manager or fails the test.
func (e *Env) Create(req api.CreateSandboxRequest) api.Sandbox {
	e.T.Helper()
	sb, err := e.M.CreateSandbox(Context(e.T), req)
	if err != nil {
		e.T.Fatalf("CreateSandbox: %v", err)
	}
	return sb
}

// Upper is the host directory holding what sandbox id wrote (it changes
// with a restore).
func (e *Env) Upper(id string) string {
	e.T.Helper()
	rec, err := e.Store.GetSandbox(context.Background(), id)
	if err != nil {
		e.T.Fatal(err)
	}
	return rec.UpperDir
}

// RuntimeSpec is the backend's spec of recorded sandbox id as far as its
// paths go: enough for the backend's Cleanup.
func (e *Env) RuntimeSpec(id string) runtime.Spec {
	e.T.Helper()
	rec, err := e.Store.GetSandbox(context.Background(), id)
	if err != nil {
		e.T.Fatal(err)
	}
	return runtime.Spec{ID: id, SocketPath: rec.SocketPath, StateDir: rec.StateDir, UpperDir: rec.UpperDir}
}

// Write puts a file into sandbox id's writable layer.
func (e *Env) Write(id, name, content string) {
	e.T.Helper()
	p := filepath.Join(e.Upper(id), name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.T.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.T.Fatal(err)
	}
}

// Result is an exec stream read to its end.
type Result struct {
	Stdout, Stderr string
	Code           int // -1 without an exit event
	Pid            int
}

// Drain reads s to its end; an error event fails the test.
func Drain(t testing.TB, s execstream.Stream) Result {
	t.Helper()
	defer s.Close()
	var r Result
	var out, errb bytes.Buffer
	r.Code = -1
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		switch ev.Type {
		case api.EventStarted:
			r.Pid = ev.Pid
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventExit:
			r.Code = *ev.ExitCode
		case api.EventError:
			t.Fatalf("exec error event: %s", ev.Error)
		}
	}
	r.Stdout, r.Stderr = out.String(), errb.String()
	return r
}

// Exec runs req in sandbox id through the Manager and reads its stream.
func (e *Env) Exec(id string, req api.ExecRequest) Result {
	e.T.Helper()
	s, err := e.M.Exec(Context(e.T), id, req)
	if err != nil {
		e.T.Fatalf("Exec(%s, %+v): %v", id, req, err)
	}
	return Drain(e.T, s)
}

// WaitFor polls cond until it holds; the bound only stops a broken test.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// DestroyAll deletes every sandbox the caller of ctx sees (every one for
// the admin) and reports the deletes that failed; one deleted meanwhile
// is no error.
func DestroyAll(ctx context.Context, m *sandbox.Manager) error {
	l, err := m.ListSandboxes(ctx, nil)
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range l {
		if err := m.DeleteSandbox(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
