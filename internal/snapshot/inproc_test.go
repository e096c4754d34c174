package snapshot_test

// The feature on a real Manager and guests (sandboxtest, the in-process
// backend, whose guest serves the sandbox's upper dir as "/"): checkpoints
// capture the writable layer, restore puts it back, forks start from it,
// diff and merge compare and combine states, an exec transaction rolls
// back.

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layergc"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
	"github.com/agentbox/agentbox/internal/snapshot"
	"github.com/agentbox/agentbox/internal/templatesvc"
)

// newEnv is a Manager with the snapshot feature attached.
func newEnv(t *testing.T) (*sandboxtest.Env, *snapshot.Snapshots) {
	var sn *snapshot.Snapshots
	h := sandboxtest.New(t, func(e *sandboxtest.Env, c *sandbox.Config) {
		sn = snapshot.New(snapshot.Config{Layers: e.Layers, Checkpoints: e.Store, IDs: c.IDs})
		c.Extensions = append(c.Extensions, sn)
	})
	return h, sn
}

// txn runs an exec transaction through the feature and reads its stream.
func txn(t *testing.T, sn *snapshot.Snapshots, id string, req api.ExecRequest) sandboxtest.Result {
	t.Helper()
	s, err := sn.Exec(sandboxtest.Context(t), id, req)
	if err != nil {
		t.Fatalf("Exec(%s, %+v): %v", id, req, err)
	}
	return sandboxtest.Drain(t, s)
}

func ctxT(t *testing.T) context.Context { return sandboxtest.Context(t) }

// Checkpoints capture the writable layer; restore puts it back; fork
// starts new sandboxes from it.
func TestInprocCheckpointRestoreFork(t *testing.T) {
	h, sn := newEnv(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{Env: map[string]string{"A": "1"}})
	h.Write(sb.ID, "work/state.txt", "one\n")
	ck, err := sn.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpointRequest{Name: "first", Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if ck.SandboxID != sb.ID || ck.Name != "first" || ck.Template != "base" || len(ck.Layers) < 2 {
		t.Fatalf("checkpoint %+v", ck)
	}
	if got, err := sn.GetCheckpoint(ctx, ck.ID); err != nil || got.ID != ck.ID {
		t.Fatalf("GetCheckpoint = %+v, %v", got, err)
	}
	if l, err := sn.ListCheckpoints(ctx, sb.ID); err != nil || len(l) != 1 {
		t.Fatalf("ListCheckpoints = %+v, %v", l, err)
	}

	h.Write(sb.ID, "work/state.txt", "two\n")
	h.Write(sb.ID, "work/extra.txt", "x\n")
	d, err := sn.Diff(ctx, "checkpoint:"+ck.ID, "sandbox:"+sb.ID, api.DiffOptions{Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Added != 1 || d.Modified != 1 || d.Deleted != 0 {
		t.Fatalf("Diff = %+v", d)
	}
	if _, err := sn.Diff(ctx, "template:base", sb.ID, api.DiffOptions{}); err != nil {
		t.Fatalf("Diff(template, bare id): %v", err)
	}
	if _, err := sn.Diff(ctx, "bogus:x", sb.ID, api.DiffOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Diff(bogus ref): %v", err)
	}
	th1, err := sn.TreeHash(ctx, sb.ID)
	if err != nil || th1.TreeHash == "" {
		t.Fatalf("TreeHash = %+v, %v", th1, err)
	}

	res, err := sn.Restore(ctx, sb.ID, "first")
	if err != nil {
		t.Fatal(err)
	}
	if res.Checkpoint != ck.ID || res.Sandbox.State != api.StateRunning {
		t.Fatalf("Restore = %+v", res)
	}
	up := h.Upper(sb.ID)
	if b, err := os.ReadFile(filepath.Join(up, "work/state.txt")); err != nil || string(b) != "one\n" {
		t.Fatalf("restored state.txt = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(up, "work/extra.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("extra.txt after restore: %v", err)
	}
	if th2, _ := sn.TreeHash(ctx, sb.ID); th2.TreeHash == th1.TreeHash {
		t.Fatal("tree hash unchanged by restore")
	}
	if r := h.Exec(sb.ID, api.ExecRequest{Command: "echo $A"}); r.Stdout != "1\n" {
		t.Fatalf("exec after restore = %+v", r)
	}

	fr, err := sn.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: 2, Labels: map[string]string{"fork": "yes"}, Env: map[string]string{"B": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Sandboxes) != 2 || fr.Checkpoint == "" {
		t.Fatalf("ForkSandbox = %+v", fr)
	}
	for _, f := range fr.Sandboxes {
		if f.Labels["fork"] != "yes" || f.Env["B"] != "2" || f.Env["A"] != "1" || f.State != api.StateRunning {
			t.Fatalf("fork %+v", f)
		}
		d, err := sn.Diff(ctx, "checkpoint:"+fr.Checkpoint, "sandbox:"+f.ID, api.DiffOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Changes {
			if strings.HasPrefix(c.Path, "/work") {
				t.Fatalf("fork differs from its checkpoint in %s", c.Path)
			}
		}
		if r := h.Exec(f.ID, api.ExecRequest{Command: "echo $B"}); r.Stdout != "2\n" {
			t.Fatalf("exec in fork = %+v", r)
		}
	}
	fc, err := sn.ForkCheckpoint(ctx, ck.ID, api.ForkRequest{})
	if err != nil || len(fc.Sandboxes) != 1 {
		t.Fatalf("ForkCheckpoint = %+v, %v", fc, err)
	}
	if _, err := sn.ForkSandbox(ctx, sb.ID, api.ForkRequest{Count: -1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork count -1: %v", err)
	}

	// The restored sandbox and the checkpoint's fork stand on ck.
	if err := sn.DeleteCheckpoint(ctx, ck.ID); !errdefs.IsConflict(err) {
		t.Fatalf("deleting a checkpoint in use: %v", err)
	}
	spare, err := sn.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpointRequest{Name: "spare"})
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.DeleteCheckpoint(ctx, spare.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.GetCheckpoint(ctx, spare.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("GetCheckpoint after delete: %v", err)
	}
	if _, err := sn.Restore(ctx, sb.ID, spare.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Restore of a deleted checkpoint: %v", err)
	}
}

// Merge applies a fork's changes to its origin; conflicts fail unless a
// strategy resolves them.
func TestInprocMerge(t *testing.T) {
	h, sn := newEnv(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	h.Write(sb.ID, "shared.txt", "base\n")
	fr, err := sn.ForkSandbox(ctx, sb.ID, api.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Sandboxes[0].ID
	h.Write(child, "new.txt", "from child\n")
	h.Write(child, "shared.txt", "child\n")
	h.Write(sb.ID, "shared.txt", "parent\n")

	if _, err := sn.Merge(ctx, sb.ID, api.MergeRequest{From: child}); !errdefs.IsConflict(err) {
		t.Fatalf("conflicting merge: %v", err)
	}
	dry, err := sn.Merge(ctx, sb.ID, api.MergeRequest{From: child, Strategy: api.MergeOurs, DryRun: true})
	if err != nil || len(dry.Conflicts) != 1 {
		t.Fatalf("dry run = %+v, %v", dry, err)
	}
	if _, err := os.Stat(filepath.Join(h.Upper(sb.ID), "new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("dry run applied a change")
	}
	res, err := sn.Merge(ctx, sb.ID, api.MergeRequest{From: child, Strategy: api.MergeTheirs})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]string{}
	for _, c := range res.Applied {
		applied[c.Path] = c.Change
	}
	if applied["/new.txt"] != "added" || applied["/shared.txt"] != "modified" || res.Base == "" || len(res.Conflicts) != 1 {
		t.Fatalf("merge = %+v", res)
	}
	for name, want := range map[string]string{"new.txt": "from child\n", "shared.txt": "child\n"} {
		if b, err := os.ReadFile(filepath.Join(h.Upper(sb.ID), name)); err != nil || string(b) != want {
			t.Fatalf("%s after merge = %q, %v", name, b, err)
		}
	}
	if _, err := sn.Merge(ctx, sb.ID, api.MergeRequest{From: child, Strategy: "sideways"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad strategy: %v", err)
	}
	other := h.Create(api.CreateSandboxRequest{})
	if _, err := sn.Merge(ctx, sb.ID, api.MergeRequest{From: other.ID}); err == nil {
		t.Fatal("merge of an unrelated sandbox succeeded")
	}
}

// An exec with RollbackOnFailure restores the checkpoint taken before it
// when the command fails.
func TestInprocExecTransaction(t *testing.T) {
	h, sn := newEnv(t)
	sb := h.Create(api.CreateSandboxRequest{})
	h.Write(sb.ID, "keep.txt", "before\n")
	// read returns keep.txt as the sandbox sees it.
	read := func() string {
		rc, _, err := sandboxfiles.New(h.M).ReadFile(ctxT(t), sb.ID, "/keep.txt")
		if err != nil {
			return err.Error()
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	r := txn(t, sn, sb.ID, api.ExecRequest{Command: "echo after > keep.txt; exit 1", RollbackOnFailure: true})
	if r.Code != 1 {
		t.Fatalf("exec = %+v", r)
	}
	if got := read(); got != "before\n" {
		t.Fatalf("after a failed transaction keep.txt = %q, want it rolled back", got)
	}
	r = txn(t, sn, sb.ID, api.ExecRequest{Command: "echo after > keep.txt", RollbackOnFailure: true})
	if r.Code != 0 {
		t.Fatalf("exec = %+v", r)
	}
	if got := read(); got != "after\n" {
		t.Fatalf("after a good transaction keep.txt = %q", got)
	}
}

// Save a sandbox as a template version and create from it; export and
// import it again.
func TestInprocTemplates(t *testing.T) {
	h, sn := newEnv(t)
	tsvc := templatesvc.New(templatesvc.Config{Templates: h.Templates, Layers: h.Layers, Sandboxes: h.M})
	gc := layergc.New(h.Layers, h.M, h.Store)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	h.Write(sb.ID, "app/app.txt", "app\n")
	v, err := tsvc.SaveTemplate(ctx, sb.ID, api.SaveTemplateRequest{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "app" || v.Version != 1 || v.Source != sb.ID {
		t.Fatalf("SaveTemplate = %+v", v)
	}
	vs, err := tsvc.TemplateVersions(ctx, "app")
	if err != nil || len(vs) != 1 {
		t.Fatalf("TemplateVersions = %+v, %v", vs, err)
	}
	ts, err := tsvc.ListTemplates(ctx)
	if err != nil || len(ts) < 2 {
		t.Fatalf("ListTemplates = %+v, %v", ts, err)
	}
	if tp, err := tsvc.GetTemplate(ctx, "app"); err != nil || tp.Name != "app" {
		t.Fatalf("GetTemplate = %+v, %v", tp, err)
	}
	app := h.Create(api.CreateSandboxRequest{Template: "app@1"})
	d, err := sn.Diff(ctx, "template:app", "sandbox:"+app.ID, api.DiffOptions{})
	if err != nil || len(d.Changes) != 0 {
		t.Fatalf("new sandbox differs from its template: %+v, %v", d, err)
	}
	rc, err := tsvc.ExportTemplate(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	tarball, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	imp, err := tsvc.ImportTemplate(ctx, "app-copy", strings.NewReader(string(tarball)))
	if err != nil {
		t.Fatal(err)
	}
	if imp.Name != "app-copy" {
		t.Fatalf("ImportTemplate = %+v", imp)
	}
	if _, err := tsvc.ImportTemplate(ctx, "broken", strings.NewReader("not a tarball")); err == nil {
		t.Fatal("import of garbage succeeded")
	}
	if gc.StorageDriver() == "" {
		t.Fatal("no storage driver")
	}
	if _, err := gc.CollectGarbage(ctx, 0); err != nil {
		t.Fatal(err)
	}
}

// A Manager built on the same store after the first one closed (a daemon
// restart) re-adopts the running sandboxes; a sandbox whose guest is gone
// is reaped.
func TestInprocRecover(t *testing.T) {
	h, sn := newEnv(t)
	ctx := ctxT(t)
	a := h.Create(api.CreateSandboxRequest{Labels: map[string]string{"n": "a"}})
	b := h.Create(api.CreateSandboxRequest{Labels: map[string]string{"n": "b"}})
	hib := h.Create(api.CreateSandboxRequest{Lifecycle: api.LifecyclePersistent})
	if _, err := h.M.SetState(ctx, hib.ID, api.StateHibernated); err != nil {
		t.Fatal(err)
	}
	ck, err := sn.CreateCheckpoint(ctx, a.ID, api.CreateCheckpointRequest{Name: "before-restart"})
	if err != nil {
		t.Fatal(err)
	}
	h.M.Close()
	// b's guest dies while no daemon runs.
	if err := inproc.New(inproc.Config{}).Cleanup(ctx, h.RuntimeSpec(b.ID)); err != nil {
		t.Fatal(err)
	}

	m2 := h.Manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := m2.GetSandbox(ctx, a.ID)
	if err != nil || got.State != api.StateRunning || got.Labels["n"] != "a" {
		t.Fatalf("recovered a = %+v, %v", got, err)
	}
	s, err := m2.Exec(ctx, a.ID, api.ExecRequest{Command: "echo again"})
	if err != nil {
		t.Fatal(err)
	}
	if r := sandboxtest.Drain(t, s); r.Stdout != "again\n" {
		t.Fatalf("exec after recover = %+v", r)
	}
	if got, err := m2.GetSandbox(ctx, b.ID); err == nil && got.State == api.StateRunning {
		t.Fatalf("b's guest is gone but it is %+v", got)
	}
	if got, err := m2.GetSandbox(ctx, hib.ID); err != nil || got.State != api.StateHibernated {
		t.Fatalf("recovered hibernated = %+v, %v", got, err)
	}
	if _, err := sn.GetCheckpoint(ctx, ck.ID); err != nil {
		t.Fatalf("checkpoint after recover: %v", err)
	}
	if q, err := h.Store.ListQuarantine(ctx); err != nil || len(q) != 0 {
		t.Fatalf("Quarantine = %+v, %v", q, err)
	}
	if _, err := m2.SetState(ctx, hib.ID, api.StateRunning); err != nil {
		t.Fatalf("waking the hibernated sandbox after recover: %v", err)
	}
}

// Named sandboxes: CreateOrGetSandbox returns the one of that name.
func TestInprocNamed(t *testing.T) {
	h, _ := newEnv(t)
	ctx := ctxT(t)
	first, created, err := h.M.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "dev"})
	if err != nil || !created {
		t.Fatalf("first = %+v, %v, %v", first, created, err)
	}
	again, created, err := h.M.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "dev"})
	if err != nil || created || again.ID != first.ID {
		t.Fatalf("again = %+v, %v, %v", again, created, err)
	}
	if _, err := h.M.SetState(ctx, first.ID, api.StateHibernated); err != nil {
		t.Fatal(err)
	}
	woke, created, err := h.M.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "dev"})
	if err != nil || created || woke.ID != first.ID {
		t.Fatalf("hibernated = %+v, %v, %v", woke, created, err)
	}
	if _, err := h.M.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "dev", Template: "app"}); !errdefs.IsConflict(err) {
		t.Fatalf("CreateSandbox of a taken name with another template: %v", err)
	}
}

// Pause, hibernate and resume on a real guest: processes are stopped while
// paused, gone after hibernation, and the sandbox answers after resume.
func TestInprocLifecycle(t *testing.T) {
	h, _ := newEnv(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{Lifecycle: api.LifecyclePersistent})
	if _, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	if got, err := h.M.SetState(ctx, sb.ID, api.StatePaused); err != nil || got.State != api.StatePaused {
		t.Fatalf("Pause = %+v, %v", got, err)
	}
	hd, err := h.M.Handle(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := hd.Stats(ctx)
	if err != nil || st.Pids < 2 {
		t.Fatalf("SandboxStats = %+v, %v", st, err)
	}
	if got, err := h.M.SetState(ctx, sb.ID, api.StateRunning); err != nil || got.State != api.StateRunning {
		t.Fatalf("Resume = %+v, %v", got, err)
	}
	if got, err := h.M.SetState(ctx, sb.ID, api.StateHibernated); err != nil || got.State != api.StateHibernated {
		t.Fatalf("Hibernate = %+v, %v", got, err)
	}
	if p := inproc.Processes(sb.ID); len(p) != 0 {
		t.Fatalf("processes of a hibernated sandbox: %v", p)
	}
	r := h.Exec(sb.ID, api.ExecRequest{Command: "echo woke"})
	if r.Stdout != "woke\n" {
		t.Fatalf("exec on a hibernated sandbox = %+v", r)
	}
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StateRunning {
		t.Fatalf("after the waking exec: %s", got.State)
	}
	tr := hd.Transitions()
	if len(tr) < 5 {
		t.Fatalf("transitions = %+v", tr)
	}
	if err := sandboxtest.DestroyAll(ctx, h.M); err != nil {
		t.Fatal(err)
	}
	if l, _ := h.M.ListSandboxes(ctx, nil); len(l) != 0 {
		t.Fatalf("after DestroyAll: %d sandboxes", len(l))
	}
}

// A checkpoint or fork of a paused or hibernated sandbox leaves it asleep,
// and checkpoint and restore are recorded in its transitions (issue 17,
// finding 8).
func TestInprocCheckpointKeepsSleepingSource(t *testing.T) {
	h, sn := newEnv(t)
	ctx := ctxT(t)
	m := h.M
	for _, sleep := range []string{api.StatePaused, api.StateHibernated} {
		sb := h.Create(api.CreateSandboxRequest{Lifecycle: api.LifecyclePersistent})
		h.Write(sb.ID, "work/f.txt", "kept\n")
		var err error
		if sleep == api.StatePaused {
			_, err = m.SetState(ctx, sb.ID, api.StatePaused)
		} else {
			_, err = m.SetState(ctx, sb.ID, api.StateHibernated)
		}
		if err != nil {
			t.Fatal(err)
		}
		ck, err := sn.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpointRequest{Name: "asleep"})
		if err != nil {
			t.Fatalf("%s: checkpoint: %v", sleep, err)
		}
		if got, _ := m.GetSandbox(ctx, sb.ID); got.State != sleep {
			t.Fatalf("after checkpoint of a %s sandbox: %s", sleep, got.State)
		}
		fr, err := sn.ForkSandbox(ctx, sb.ID, api.ForkRequest{})
		if err != nil {
			t.Fatalf("%s: fork: %v", sleep, err)
		}
		if got, _ := m.GetSandbox(ctx, sb.ID); got.State != sleep {
			t.Fatalf("after fork of a %s sandbox: %s", sleep, got.State)
		}
		if len(fr.Sandboxes) != 1 || fr.Sandboxes[0].State != api.StateRunning {
			t.Fatalf("%s: fork %+v", sleep, fr)
		}
		if _, err := sn.Restore(ctx, sb.ID, ck.ID); err != nil {
			t.Fatal(err)
		}
		hd, err := m.Handle(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		ts := hd.Transitions()
		causes := map[string]string{}
		for _, tr := range ts {
			if tr.From == tr.To {
				causes[tr.Cause] = tr.Detail
			}
		}
		if causes[api.CauseCheckpoint] == "" || causes[api.CauseRestore] != ck.ID {
			t.Fatalf("%s: transitions %+v", sleep, ts)
		}
	}
}

// Implicit checkpoints are kept per sandbox up to the retention's count
// and age, listed with Implicit and ExpiresAt; a fork's base and the
// user's checkpoints stay (issue 17, finding 7).
func TestInprocImplicitRetention(t *testing.T) {
	var sn *snapshot.Snapshots
	h := sandboxtest.New(t, func(e *sandboxtest.Env, c *sandbox.Config) {
		sn = snapshot.New(snapshot.Config{Layers: e.Layers, Checkpoints: e.Store, IDs: c.IDs,
			Retention: snapshot.Retention{Keep: 2, MaxAge: time.Hour}})
		c.Extensions = append(c.Extensions, sn)
	})
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	mine, err := sn.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpointRequest{Name: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if mine.Implicit != "" || mine.ExpiresAt != nil {
		t.Fatalf("a user's checkpoint: %+v", mine)
	}
	fr, err := sn.ForkSandbox(ctx, sb.ID, api.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var execs []string
	for i := range 4 {
		h.Write(sb.ID, "work/n.txt", strings.Repeat("x", i+1))
		if r := txn(t, sn, sb.ID, api.ExecRequest{Command: "true", CheckpointBefore: true}); r.Code != 0 {
			t.Fatalf("transaction: %+v", r)
		}
		cks, err := sn.ListCheckpoints(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		execs = append(execs, cks[len(cks)-1].ID)
	}
	cks, err := sn.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.Checkpoint{}
	for _, c := range cks {
		got[c.ID] = c
	}
	if _, ok := got[mine.ID]; !ok {
		t.Error("the user's checkpoint was pruned")
	}
	if c, ok := got[fr.Checkpoint]; !ok || c.Implicit != "fork" {
		t.Errorf("the fork's base: %+v (kept %v)", c, ok)
	}
	for i, id := range execs {
		c, ok := got[id]
		if kept := i >= 2; ok != kept {
			t.Errorf("exec checkpoint %d kept %v, want %v", i, ok, kept)
		}
		if ok && (c.Implicit != "exec" || c.ExpiresAt == nil || !c.ExpiresAt.Equal(c.CreatedAt.Add(time.Hour))) {
			t.Errorf("exec checkpoint %d: %+v", i, c)
		}
	}
	// With the fork gone, its base goes at the next prune.
	if err := h.M.DeleteSandbox(ctx, fr.Sandboxes[0].ID); err != nil {
		t.Fatal(err)
	}
	if n := sn.PruneImplicit(ctx, sb.ID); n != 1 {
		t.Errorf("pruned %d after the fork went, want 1 (its base)", n)
	}
}
