package sandbox_test

// Tests of the Manager through its exported API, on the in-process backend
// (see package sandboxtest for what it does and does not stand in for).

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
)

func ctxT(t *testing.T) context.Context { return sandboxtest.Context(t) }

func TestInprocCreateExecDelete(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{Env: map[string]string{"GREETING": "hi"}, Labels: map[string]string{"team": "a"}})
	if sb.State != api.StateRunning || sb.Template != "base" || sb.Backend != inproc.Name || sb.Env["FROM_TEMPLATE"] != "yes" {
		t.Fatalf("created %+v", sb)
	}
	r := h.Exec(sb.ID, api.ExecRequest{Command: "echo $GREETING; echo err >&2; exit 3", Env: map[string]string{"GREETING": "hello"}})
	if r.Stdout != "hello\n" || r.Stderr != "err\n" || r.Code != 3 {
		t.Fatalf("exec = %+v", r)
	}
	if got, err := h.M.GetSandbox(ctx, sb.ID); err != nil || got.ID != sb.ID || got.State != api.StateRunning {
		t.Fatalf("GetSandbox = %+v, %v", got, err)
	}
	if got, err := lookup(ctx, h.M, sb.ID); err != nil || got.Labels["team"] != "a" {
		t.Fatalf("LookupSandbox = %+v, %v", got, err)
	}
	other := h.Create(api.CreateSandboxRequest{Labels: map[string]string{"team": "b"}})
	if l, err := h.M.ListSandboxes(ctx, map[string]string{"team": "b"}); err != nil || len(l) != 1 || l[0].ID != other.ID {
		t.Fatalf("ListSandboxes(team=b) = %+v, %v", l, err)
	}
	if l, _ := h.M.ListSandboxes(ctx, nil); len(l) != 2 {
		t.Fatalf("ListSandboxes = %d sandboxes, want 2", len(l))
	}
	info, err := h.M.Info(ctx)
	if err != nil || info.Backend != inproc.Name || info.Sandboxes != 2 || info.Version != "v-test" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if info, _ := h.M.Info(t.Context()); info.Backend != inproc.Name {
		t.Fatalf("Backend = %+v", info.Backend)
	}
	if err := h.M.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.M.GetSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("GetSandbox after delete: %v", err)
	}
	if err := h.M.DeleteSandbox(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := h.M.Exec(ctx, sb.ID, api.ExecRequest{Command: "true"}); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after delete: %v", err)
	}
	if p := inproc.Processes(sb.ID); len(p) != 0 {
		t.Fatalf("processes left: %v", p)
	}
}

func TestInprocCreateRefusesBadRequests(t *testing.T) {
	h := sandboxtest.New(t)
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
		if _, err := h.M.CreateSandbox(ctxT(t), req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("CreateSandbox(%+v) = %v, want invalid argument", req, err)
		}
	}
	if _, err := h.M.CreateSandbox(ctxT(t), api.CreateSandboxRequest{Template: "missing"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown template: %v", err)
	}
	if l, _ := h.M.ListSandboxes(ctxT(t), nil); len(l) != 0 {
		t.Errorf("refused creates left %d sandboxes", len(l))
	}
}

// Files written through the Manager are files of the guest's filesystem
// (the host's, on this backend).
func TestInprocFiles(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	files := sandboxfiles.New(h.M)
	sb := h.Create(api.CreateSandboxRequest{})
	dir := h.Upper(sb.ID)
	p := "/notes/a.txt"
	if _, err := files.WriteFile(ctx, sb.ID, p, 0o600, true, strings.NewReader("alpha")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != "alpha" {
		t.Fatalf("written file in the upper dir = %q, %v", b, err)
	}
	rc, fi, err := files.ReadFile(ctx, sb.ID, p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "alpha" || fi.Size != 5 || fi.Path != p {
		t.Fatalf("ReadFile = %q, %+v", b, fi)
	}
	if fi, err := files.Stat(ctx, sb.ID, p); err != nil || fi.Type != api.FileTypeFile {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	if _, err := files.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/d1/d2", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := files.Move(ctx, sb.ID, api.MoveRequest{From: p, To: "/d1/b.txt"}); err != nil {
		t.Fatal(err)
	}
	l, err := files.List(ctx, sb.ID, "/d1")
	if err != nil || len(l) != 2 {
		t.Fatalf("List = %+v, %v", l, err)
	}
	ar, err := files.ReadArchive(ctx, sb.ID, "/d1")
	if err != nil {
		t.Fatal(err)
	}
	tarball, err := io.ReadAll(ar)
	ar.Close()
	if err != nil || len(tarball) == 0 {
		t.Fatalf("ReadArchive: %d bytes, %v", len(tarball), err)
	}
	if err := files.WriteArchive(ctx, sb.ID, "/copy", bytes.NewReader(tarball)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "copy", "b.txt")); err != nil || string(b) != "alpha" {
		t.Fatalf("extracted b.txt = %q, %v", b, err)
	}
	if r := h.Exec(sb.ID, api.ExecRequest{Command: "cat copy/b.txt"}); r.Stdout != "alpha" {
		t.Fatalf("cat in the sandbox's directory = %+v", r)
	}
	if err := files.Remove(ctx, sb.ID, "/d1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := files.Stat(ctx, sb.ID, "/d1"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat after Remove: %v", err)
	}
	if _, _, err := files.ReadFile(ctx, "nosuchbox", p); !errdefs.IsNotFound(err) {
		t.Fatalf("ReadFile of an unknown sandbox: %v", err)
	}
}

// Background processes: start, list, stdin, attach, signal.
func TestInprocProcesses(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	files := sandboxfiles.New(h.M)
	sb := h.Create(api.CreateSandboxRequest{})
	p, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "read line; echo got $line", StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := files.ListProcesses(ctx, sb.ID)
	if err != nil || len(ps) != 1 || ps[0].Pid != p.Pid || !ps[0].Running {
		t.Fatalf("ListProcesses = %+v, %v", ps, err)
	}
	if err := files.WriteStdin(ctx, sb.ID, p.Pid, strings.NewReader("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	s, err := h.M.Attach(ctx, sb.ID, p.Pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Drain(t, s); r.Stdout != "got hello\n" || r.Code != 0 {
		t.Fatalf("attached = %+v", r)
	}
	sleeper, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	hd, err := h.M.Handle(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	w, err := hd.Watch(ctx, sleeper.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := files.Signal(ctx, sb.ID, sleeper.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Drain(t, w); r.Code != 137 && r.Code != -1 {
		t.Logf("watched exit %+v", r)
	}
	if err := files.Signal(ctx, sb.ID, 999999, "TERM"); !errdefs.IsNotFound(err) {
		t.Fatalf("Signal(unknown pid) = %v", err)
	}
	tty, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000", TTY: &api.TTY{Rows: 10, Cols: 40}})
	if err != nil {
		t.Fatal(err)
	}
	if err := files.Resize(ctx, sb.ID, tty.Pid, api.TTY{Rows: 20, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	if err := files.Signal(ctx, sb.ID, tty.Pid, "KILL"); err != nil {
		t.Fatal(err)
	}
}

// lookup is sandbox id as recorded (Handle.Sandbox), as the caller of ctx
// sees it.
func lookup(ctx context.Context, m *sandbox.Manager, id string) (api.Sandbox, error) {
	h, err := m.Handle(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return h.Sandbox(), nil
}
