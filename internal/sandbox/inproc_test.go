package sandbox_test

// Tests of the Manager through its exported API, on the in-process backend
// (internal/runtime/inproc): real guests, a real layer store (copy driver)
// and templates, no root. The backend does not isolate: the guest serves
// the sandbox's writable layer (its UpperDir, upper below) as "/" and runs
// commands there as host processes, so a command line must name no
// absolute path (it would be the host's); tests put what "the sandbox
// wrote" into the upper dir (write) or write relative paths.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
)

// harness is a Manager on the in-process backend with a layer store and a
// template "base" (one layer holding etc/base.txt) as its default.
type harness struct {
	t       *testing.T
	m       *sandbox.Manager
	st      *store.Bolt
	ls      *layers.Store
	tm      *templates.Manager
	cfg     sandbox.Config
	base    layers.Layer
	backend *inproc.Backend
}

func newHarness(t *testing.T, edit ...func(*sandbox.Config)) *harness {
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
	runner, err := sandbox.PrepareRunner(filepath.Join(dir, "runners"), bin)
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "abxi") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	cfg := sandbox.Config{
		DataDir: filepath.Join(dir, "data"), RunDir: runDir, RunnerDir: runner,
		IDs: ids, DefaultTemplate: "base", Layers: ls, Version: "v-test",
		Logger: slog.New(slog.DiscardHandler),
	}
	for _, e := range edit {
		e(&cfg)
	}
	h := &harness{t: t, st: st, ls: ls, tm: tm, cfg: cfg, base: base, backend: inproc.New(inproc.Config{Version: "guest-test"})}
	h.m = h.manager()
	return h
}

// manager returns a new Manager on the harness's store and directories, as
// a restarted daemon builds one.
func (h *harness) manager() *sandbox.Manager {
	h.t.Helper()
	m, err := sandbox.New(h.cfg, h.backend, h.tm, h.st)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = m.DestroyAll(context.Background())
		m.Close()
	})
	return m
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (h *harness) create(req api.CreateSandboxRequest) api.Sandbox {
	h.t.Helper()
	sb, err := h.m.CreateSandbox(ctxT(h.t), req)
	if err != nil {
		h.t.Fatalf("CreateSandbox: %v", err)
	}
	return sb
}

// upper is the host directory holding what sandbox id wrote.
func (h *harness) upper(id string) string {
	h.t.Helper()
	rec, err := h.st.GetSandbox(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return rec.UpperDir
}

// write puts a file into sandbox id's writable layer.
func (h *harness) write(id, name, content string) {
	h.t.Helper()
	p := filepath.Join(h.upper(id), name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

type execResult struct {
	stdout, stderr string
	code           int
	pid            int
}

func drain(t *testing.T, s execstream.Stream) execResult {
	t.Helper()
	defer s.Close()
	var r execResult
	var out, errb bytes.Buffer
	r.code = -1
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
			r.pid = ev.Pid
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventExit:
			r.code = *ev.ExitCode
		case api.EventError:
			t.Fatalf("exec error event: %s", ev.Error)
		}
	}
	r.stdout, r.stderr = out.String(), errb.String()
	return r
}

func (h *harness) exec(id string, req api.ExecRequest) execResult {
	h.t.Helper()
	s, err := h.m.Exec(ctxT(h.t), id, req)
	if err != nil {
		h.t.Fatalf("Exec(%s, %+v): %v", id, req, err)
	}
	return drain(h.t, s)
}

func TestInprocCreateExecDelete(t *testing.T) {
	h := newHarness(t)
	ctx := ctxT(t)
	sb := h.create(api.CreateSandboxRequest{Env: map[string]string{"GREETING": "hi"}, Labels: map[string]string{"team": "a"}})
	if sb.State != api.StateRunning || sb.Template != "base" || sb.Backend != inproc.Name || sb.Env["FROM_TEMPLATE"] != "yes" {
		t.Fatalf("created %+v", sb)
	}
	r := h.exec(sb.ID, api.ExecRequest{Command: "echo $GREETING; echo err >&2; exit 3", Env: map[string]string{"GREETING": "hello"}})
	if r.stdout != "hello\n" || r.stderr != "err\n" || r.code != 3 {
		t.Fatalf("exec = %+v", r)
	}
	if got, err := h.m.GetSandbox(ctx, sb.ID); err != nil || got.ID != sb.ID || got.State != api.StateRunning {
		t.Fatalf("GetSandbox = %+v, %v", got, err)
	}
	if got, err := h.m.LookupSandbox(ctx, sb.ID); err != nil || got.Labels["team"] != "a" {
		t.Fatalf("LookupSandbox = %+v, %v", got, err)
	}
	other := h.create(api.CreateSandboxRequest{Labels: map[string]string{"team": "b"}})
	if l, err := h.m.ListSandboxes(ctx, map[string]string{"team": "b"}); err != nil || len(l) != 1 || l[0].ID != other.ID {
		t.Fatalf("ListSandboxes(team=b) = %+v, %v", l, err)
	}
	if l, _ := h.m.ListSandboxes(ctx, nil); len(l) != 2 {
		t.Fatalf("ListSandboxes = %d sandboxes, want 2", len(l))
	}
	info, err := h.m.Info(ctx)
	if err != nil || info.Backend != inproc.Name || info.Sandboxes != 2 || info.Version != "v-test" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if h.m.Backend().Name != inproc.Name {
		t.Fatalf("Backend = %+v", h.m.Backend())
	}
	if err := h.m.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.GetSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("GetSandbox after delete: %v", err)
	}
	if err := h.m.DeleteSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := h.m.Exec(ctx, sb.ID, api.ExecRequest{Command: "true"}); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after delete: %v", err)
	}
	if p := inproc.Processes(sb.ID); len(p) != 0 {
		t.Fatalf("processes left: %v", p)
	}
}

func TestInprocCreateRefusesBadRequests(t *testing.T) {
	h := newHarness(t)
	for _, req := range []api.CreateSandboxRequest{
		{Template: "Not A Template"},
		{Env: map[string]string{"1BAD": "x"}},
		{Labels: map[string]string{"-bad": "x"}},
		{Resources: api.Resources{CPUs: -1}},
		{Resources: api.Resources{MemoryBytes: 1 << 20}},
		{Resources: api.Resources{PidsMax: 2}},
		{TimeoutSeconds: -1},
		{Hostname: "Bad_Host"},
		{Lifecycle: "forever"},
	} {
		if _, err := h.m.CreateSandbox(ctxT(t), req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("CreateSandbox(%+v) = %v, want invalid argument", req, err)
		}
	}
	if _, err := h.m.CreateSandbox(ctxT(t), api.CreateSandboxRequest{Template: "missing"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown template: %v", err)
	}
	if l, _ := h.m.ListSandboxes(ctxT(t), nil); len(l) != 0 {
		t.Errorf("refused creates left %d sandboxes", len(l))
	}
}

// Files written through the Manager are files of the guest's filesystem
// (the host's, on this backend).
func TestInprocFiles(t *testing.T) {
	h := newHarness(t)
	ctx := ctxT(t)
	sb := h.create(api.CreateSandboxRequest{})
	dir := h.upper(sb.ID)
	p := "/notes/a.txt"
	if _, err := h.m.WriteFile(ctx, sb.ID, p, 0o600, true, strings.NewReader("alpha")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != "alpha" {
		t.Fatalf("written file in the upper dir = %q, %v", b, err)
	}
	rc, fi, err := h.m.ReadFile(ctx, sb.ID, p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "alpha" || fi.Size != 5 || fi.Path != p {
		t.Fatalf("ReadFile = %q, %+v", b, fi)
	}
	if fi, err := h.m.Stat(ctx, sb.ID, p); err != nil || fi.Type != api.FileTypeFile {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	if _, err := h.m.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/d1/d2", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Move(ctx, sb.ID, api.MoveRequest{From: p, To: "/d1/b.txt"}); err != nil {
		t.Fatal(err)
	}
	l, err := h.m.List(ctx, sb.ID, "/d1")
	if err != nil || len(l) != 2 {
		t.Fatalf("List = %+v, %v", l, err)
	}
	ar, err := h.m.ReadArchive(ctx, sb.ID, "/d1")
	if err != nil {
		t.Fatal(err)
	}
	tarball, err := io.ReadAll(ar)
	ar.Close()
	if err != nil || len(tarball) == 0 {
		t.Fatalf("ReadArchive: %d bytes, %v", len(tarball), err)
	}
	if err := h.m.WriteArchive(ctx, sb.ID, "/copy", bytes.NewReader(tarball)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "copy", "b.txt")); err != nil || string(b) != "alpha" {
		t.Fatalf("extracted b.txt = %q, %v", b, err)
	}
	if r := h.exec(sb.ID, api.ExecRequest{Command: "cat copy/b.txt"}); r.stdout != "alpha" {
		t.Fatalf("cat in the sandbox's directory = %+v", r)
	}
	if err := h.m.Remove(ctx, sb.ID, "/d1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Stat(ctx, sb.ID, "/d1"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat after Remove: %v", err)
	}
	if _, _, err := h.m.ReadFile(ctx, "nosuchbox", p); !errdefs.IsNotFound(err) {
		t.Fatalf("ReadFile of an unknown sandbox: %v", err)
	}
}

// Background processes: start, list, stdin, attach, signal.
func TestInprocProcesses(t *testing.T) {
	h := newHarness(t)
	ctx := ctxT(t)
	sb := h.create(api.CreateSandboxRequest{})
	p, err := h.m.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "read line; echo got $line", StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := h.m.ListProcesses(ctx, sb.ID)
	if err != nil || len(ps) != 1 || ps[0].Pid != p.Pid || !ps[0].Running {
		t.Fatalf("ListProcesses = %+v, %v", ps, err)
	}
	if err := h.m.WriteStdin(ctx, sb.ID, p.Pid, strings.NewReader("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	s, err := h.m.Attach(ctx, sb.ID, p.Pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := drain(t, s); r.stdout != "got hello\n" || r.code != 0 {
		t.Fatalf("attached = %+v", r)
	}
	sleeper, err := h.m.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := h.m.WatchProcess(ctx, sb.ID, sleeper.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Signal(ctx, sb.ID, sleeper.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	if r := drain(t, w); r.code != 137 && r.code != -1 {
		t.Logf("watched exit %+v", r)
	}
	if err := h.m.Signal(ctx, sb.ID, 999999, "TERM"); !errdefs.IsNotFound(err) {
		t.Fatalf("Signal(unknown pid) = %v", err)
	}
	tty, err := h.m.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000", TTY: &api.TTY{Rows: 10, Cols: 40}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Resize(ctx, sb.ID, tty.Pid, api.TTY{Rows: 20, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Signal(ctx, sb.ID, tty.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
}
