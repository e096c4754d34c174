package sandboxfiles_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
)

// calls records the guest calls the core's observers see.
type calls struct {
	mu  sync.Mutex // mu guards ops.
	ops []sandbox.Op
}

func (c *calls) Name() string { return "calls" }

func (c *calls) Observe(_ context.Context, op sandbox.Op) {
	if op.Kind != sandbox.OpGuestCall {
		return
	}
	c.mu.Lock()
	c.ops = append(c.ops, op)
	c.mu.Unlock()
}

func (c *calls) take() []sandbox.Op {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := c.ops
	c.ops = nil
	return ops
}

// Every operation is one guest call, observed under the detail it has
// always had (observers and the flight recorder key on them).
func TestEveryOperationIsOneObservedGuestCall(t *testing.T) {
	obs := &calls{}
	h := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) {
		c.Extensions = append(c.Extensions, obs)
	})
	ctx := sandboxtest.Context(t)
	f := sandboxfiles.New(h.M)
	sb := h.Create(api.CreateSandboxRequest{})
	obs.take()

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.WriteFile(ctx, sb.ID, "/a.txt", 0o644, false, strings.NewReader("a"))
	must(err)
	rc, _, err := f.ReadFile(ctx, sb.ID, "/a.txt")
	must(err)
	rc.Close()
	_, err = f.Stat(ctx, sb.ID, "/a.txt")
	must(err)
	_, err = f.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/d"})
	must(err)
	must(f.Move(ctx, sb.ID, api.MoveRequest{From: "/a.txt", To: "/d/a.txt"}))
	_, err = f.List(ctx, sb.ID, "/d")
	must(err)
	ar, err := f.ReadArchive(ctx, sb.ID, "/d")
	must(err)
	tarball, err := io.ReadAll(ar)
	ar.Close()
	must(err)
	must(f.WriteArchive(ctx, sb.ID, "/e", bytes.NewReader(tarball)))
	must(f.Remove(ctx, sb.ID, "/e", true))
	p, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "cat", StdinOpen: true, TTY: &api.TTY{Rows: 10, Cols: 40}})
	must(err)
	ops := obs.take()
	_, err = f.ListProcesses(ctx, sb.ID)
	must(err)
	must(f.Resize(ctx, sb.ID, p.Pid, api.TTY{Rows: 20, Cols: 80}))
	must(f.WriteStdin(ctx, sb.ID, p.Pid, strings.NewReader("x\n"), false))
	must(f.Signal(ctx, sb.ID, p.Pid, "KILL"))

	var got []string
	for _, op := range append(ops, obs.take()...) {
		if op.Sandbox != sb.ID || op.Err != nil {
			t.Errorf("op %+v", op)
		}
		got = append(got, op.Detail)
	}
	pid := strconv.Itoa(p.Pid)
	want := []string{
		"writing /a.txt", "reading /a.txt", "stat /a.txt", "creating directory /d",
		"moving /a.txt to /d/a.txt", "listing /d", "archiving /d", "extracting into /e",
		"removing /e", "listing processes", "resizing process " + pid,
		"writing stdin of process " + pid, "signalling process " + pid,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("observed %q\nwant %q", got, want)
	}
}

// A guest's error keeps its category and names the operation and the
// sandbox; a sandbox the caller cannot see is not found and not observed.
func TestErrors(t *testing.T) {
	obs := &calls{}
	h := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) {
		c.Extensions = append(c.Extensions, obs)
	})
	ctx := sandboxtest.Context(t)
	f := sandboxfiles.New(h.M)
	sb := h.Create(api.CreateSandboxRequest{})
	obs.take()
	_, err := f.Stat(ctx, sb.ID, "/nope")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "stat /nope in sandbox "+sb.ID) {
		t.Fatalf("Stat(missing) = %v", err)
	}
	if ops := obs.take(); len(ops) != 1 || ops[0].Err == nil {
		t.Fatalf("observed %+v", ops)
	}
	if _, err := f.Stat(ctx, "nosuchbox", "/"); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat(unknown sandbox) = %v", err)
	}
	if ops := obs.take(); len(ops) != 0 {
		t.Fatalf("unknown sandbox observed %+v", ops)
	}
}
