package sandbox_test

// The core's API for features (core_snapshot.go: LockRunning, CreateFork,
// Handle.Reset, Handle.ReadFS, ForkBase; templates.go: the step runner of
// template builds) driven through the features that use it, on the
// in-process backend.

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/snapshot"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/templatesvc"
	"github.com/agentbox/agentbox/internal/testutil"
)

// Checkpoint, diff, restore and fork reach the core through LockRunning,
// ReadFS, Reset and CreateFork; a fork records its base, and a restarted
// Manager re-adopts the fork and the restored sandbox on their
// checkpoints' layers.
func TestInprocCheckpointCoreAPI(t *testing.T) {
	var sn *snapshot.Snapshots
	h := sandboxtest.New(t, func(e *sandboxtest.Env, c *sandbox.Config) {
		sn = snapshot.New(snapshot.Config{Layers: e.Layers, Checkpoints: e.Store, IDs: c.IDs})
		c.Extensions = append(c.Extensions, sn)
	})
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	h.Write(sb.ID, "state.txt", "one\n")
	ck, err := sn.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpointRequest{Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	h.Write(sb.ID, "state.txt", "two\n")
	if d, err := sn.Diff(ctx, "checkpoint:"+ck.ID, "sandbox:"+sb.ID, api.DiffOptions{}); err != nil || d.Modified != 1 {
		t.Fatalf("Diff = %+v, %v", d, err)
	}
	if _, err := sn.Restore(ctx, sb.ID, ck.ID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(h.Upper(sb.ID), "state.txt")); err != nil || string(b) != "one\n" {
		t.Fatalf("restored state.txt = %q, %v", b, err)
	}
	fr, err := sn.ForkCheckpoint(ctx, ck.ID, api.ForkRequest{Count: 1})
	if err != nil || len(fr.Sandboxes) != 1 {
		t.Fatalf("ForkCheckpoint = %+v, %v", fr, err)
	}
	fork := fr.Sandboxes[0].ID
	hd, err := h.M.Handle(ctx, fork)
	if err != nil {
		t.Fatal(err)
	}
	if hd.ForkBase() != ck.ID {
		t.Fatalf("ForkBase = %q, want %q", hd.ForkBase(), ck.ID)
	}
	if hd.StateDir() == "" || hd.Guest() == nil {
		t.Fatalf("fork's handle: state dir %q, guest %v", hd.StateDir(), hd.Guest())
	}
	dirs, release, err := hd.ReadFS(ctx)
	if err != nil || len(dirs) < 2 {
		t.Fatalf("ReadFS = %v, %v", dirs, err)
	}
	release()
	if r := h.Exec(fork, api.ExecRequest{Command: "cat state.txt"}); r.Stdout != "one\n" {
		t.Fatalf("fork's state.txt = %+v", r)
	}
	if err := hd.Update(ctx, func(sb *api.Sandbox) { sb.Labels = map[string]string{"k": "v"} }); err != nil {
		t.Fatal(err)
	}
	if id1, id2 := sandbox.NewID(), sandbox.NewID(); sandbox.LayerOwner(fork) == sandbox.LayerOwner(sb.ID) || id1 == id2 {
		t.Fatal("LayerOwner or NewID names two things alike")
	}

	// A restarted Manager re-adopts both on their checkpoint's layers.
	h.M.Close()
	m2 := h.Manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, fork} {
		got, err := m2.GetSandbox(ctx, id)
		if err != nil || got.State != api.StateRunning {
			t.Fatalf("recovered %s = %+v, %v", id, got, err)
		}
	}
	if got, _ := m2.GetSandbox(ctx, fork); got.Labels["k"] != "v" {
		t.Fatalf("the fork's updated labels are lost: %+v", got.Labels)
	}
	if err := m2.DeleteSandbox(ctx, fork); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Handle(ctx, fork); !errdefs.IsNotFound(err) {
		t.Fatalf("Handle of a deleted sandbox: %v", err)
	}
}

// A template build's "run" step runs in a sandbox of the core (the
// StepRunner the Manager hands its template store at construction).
func TestInprocTemplateBuildStep(t *testing.T) {
	testutil.RequiresFile(t, "/bin/busybox", "the busybox base of the template built")
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	cfg := h.Config
	cfg.DataDir = filepath.Join(t.TempDir(), "data2")
	var tm *templates.Manager
	cfg.NewTemplates = func(r *sandbox.StepRunner) (sandbox.Templates, error) {
		var err error
		tm, err = templates.New(templates.Config{DataDir: filepath.Join(t.TempDir(), "templates"), Layers: h.Layers, Runner: r, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		return tm, nil
	}
	backends, err := runtime.NewRegistry("", h.Backend)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sandbox.New(cfg, backends, nil, h.Store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sandboxtest.DestroyAll(context.Background(), m); m.Close() })
	ts := templatesvc.New(templatesvc.Config{Templates: tm, Layers: h.Layers, Sandboxes: m})
	var logs []string
	tmpl, err := ts.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "built", Base: "busybox",
		Steps: []api.TemplateStep{{Run: "echo built > built.txt; echo step-output"}},
	}}, func(ev api.BuildEvent) {
		if ev.Type == api.BuildEventLog {
			logs = append(logs, ev.Message)
		}
	})
	if err != nil {
		t.Fatalf("BuildTemplate: %v (output %q)", err, logs)
	}
	if tmpl.Name != "built" {
		t.Fatalf("BuildTemplate = %+v", tmpl)
	}
	sb, err := m.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "built"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Exec(ctx, sb.ID, api.ExecRequest{Command: "cat built.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Drain(t, s); r.Stdout != "built\n" {
		t.Fatalf("a sandbox of the built template reads %+v", r)
	}
	if _, err := ts.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "broken", Base: "busybox", Steps: []api.TemplateStep{{Run: "exit 3"}},
	}}, nil); err == nil {
		t.Fatal("a failing step built a template")
	}
}
