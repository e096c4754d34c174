package pipeline

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// drain reads a stream to its end as the HTTP edge does, then closes it.
func drain(t *testing.T, exe *Execution, between func()) []api.ExecEvent {
	t.Helper()
	var evs []api.ExecEvent
	for {
		ev, err := exe.Stream.Next()
		if err != nil {
			break
		}
		evs = append(evs, ev)
		if ev.Type == api.EventStarted && between != nil {
			between()
		}
	}
	exe.Stream.Close()
	return evs
}

func TestExecuteRecordsAPIRun(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "busybox"})
	e.sbx.burn = 3 * time.Second
	exe, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, Who: "unix-socket", SandboxID: sb.ID, Exec: api.ExecRequest{Cmd: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	// Running: visible before it ends.
	if r, err := e.p.Get(ctx, exe.ID); err != nil || r.State != api.RunRunning {
		t.Fatalf("running record: %+v %v", r, err)
	}
	drain(t, exe, func() { e.clk.Advance(10 * time.Second) })
	e.p.Flush()                        // records are written after the exit event
	r, err := e.st.GetRun(ctx, exe.ID) // durable, not only in memory
	if err != nil {
		t.Fatal(err)
	}
	if r.State != api.RunFinished || r.ExitCode == nil || *r.ExitCode != 0 || r.Trigger != api.TriggerAPI ||
		r.Who != "unix-socket" || r.Tenant != DefaultTenant || r.Sandbox != sb.ID || r.Template != "busybox" || r.Cmd[0] != "true" {
		t.Fatalf("record %+v", r)
	}
	if r.DurationSeconds != 10 || r.EndedAt == nil || !r.EndedAt.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("times: %+v", r)
	}
	if r.Usage.CPUSeconds != 3 {
		t.Fatalf("cpu %v, want 3", r.Usage.CPUSeconds)
	}
	// 1 GiB resident for 10 s, sampled every second by the fake clock.
	if r.Usage.MemoryGBSeconds < 9.99 || r.Usage.MemoryGBSeconds > 10.01 {
		t.Fatalf("memory %v GB-s, want 10", r.Usage.MemoryGBSeconds)
	}
	if len(r.Output) != 0 {
		t.Fatalf("API runs keep no output: %q", r.Output)
	}
	if got := e.sbx.execs[0].Env[api.RunIDEnv]; got != exe.ID {
		t.Fatalf("run id env %q", got)
	}
	if len(e.sbx.deleted) != 0 {
		t.Fatal("an API run deleted its sandbox")
	}
}

func TestExecuteDetachedRunFinishedByFollower(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	e.sbx.hold = make(chan struct{})
	exe, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, Who: "x", SandboxID: sb.ID, Exec: api.ExecRequest{Command: "sleep 1"}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, _ := exe.Stream.Next(); ev.Type != api.EventStarted {
		t.Fatalf("first event %+v", ev)
	}
	exe.Stream.Close() // the client goes away; the process runs on
	waitFor(t, func() bool { r, _ := e.p.Get(ctx, exe.ID); return r.State == api.RunFinished })
	if r, _ := e.p.Get(ctx, exe.ID); r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("record %+v", r)
	}
}

func TestExecuteBackgroundRun(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	exe, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, Who: "x", SandboxID: sb.ID, Exec: api.ExecRequest{Command: "x", Background: true}})
	if err != nil || exe.Process.Pid == 0 || exe.Stream != nil {
		t.Fatalf("%+v %v", exe, err)
	}
	waitFor(t, func() bool { r, _ := e.p.Get(ctx, exe.ID); return r.State == api.RunFinished })
}

func TestExecuteFailures(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, SandboxID: "nope", Exec: api.ExecRequest{Command: "x"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	_, err := e.p.Execute(ctx, Run{Trigger: api.TriggerSchedule, Who: "schedule:x", Create: &api.CreateSandboxRequest{Template: "missing"}, Exec: api.ExecRequest{Command: "x"}})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("missing template: %v", err)
	}
	runs, _ := e.p.List(ctx, store.RunFilter{})
	if len(runs) != 1 || runs[0].State != api.RunFailed || !strings.Contains(runs[0].Error, "template missing") || runs[0].EndedAt == nil {
		t.Fatalf("failed run record: %+v", runs)
	}
}

func TestActionSandboxes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// No name: a fresh sandbox per run, deleted after it.
	r, err := e.p.runAction(ctx, api.TriggerSchedule, "schedule:s", "", api.RunAction{Template: "busybox", Command: "echo"}, nil, []byte("in"))
	if err != nil {
		t.Fatal(err)
	}
	if len(e.sbx.deleted) != 1 || e.sbx.deleted[0] != r.Sandbox || string(r.Output) != "in" {
		t.Fatalf("ephemeral: deleted %v, run %+v", e.sbx.deleted, r)
	}
	// A name: the same sandbox every run, kept.
	a := api.RunAction{Name: "nightly", Lifecycle: api.LifecyclePersistent, Command: "echo"}
	r1, _ := e.p.runAction(ctx, api.TriggerSchedule, "schedule:s", "", a, nil, nil)
	r2, _ := e.p.runAction(ctx, api.TriggerSchedule, "schedule:s", "", a, nil, nil)
	if r1.Sandbox == "" || r1.Sandbox != r2.Sandbox || len(e.sbx.deleted) != 1 {
		t.Fatalf("named: %s %s deleted %v", r1.Sandbox, r2.Sandbox, e.sbx.deleted)
	}
}

func TestListFiltersAndOrder(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	b, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	var ids []string
	for i, sb := range []string{a.ID, b.ID, a.ID} {
		trig := api.TriggerAPI
		if i == 2 {
			trig = api.TriggerWebhook
		}
		exe, err := e.p.Execute(ctx, Run{Trigger: trig, Who: "w", SandboxID: sb, Exec: api.ExecRequest{Command: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, exe, nil)
		ids = append(ids, exe.ID)
		e.clk.Advance(time.Second)
	}
	all, _ := e.p.List(ctx, store.RunFilter{})
	if len(all) != 3 || all[0].ID != ids[2] || all[2].ID != ids[0] {
		t.Fatalf("newest first: %v", all)
	}
	if got, _ := e.p.List(ctx, store.RunFilter{Sandbox: a.ID}); len(got) != 2 {
		t.Fatalf("by sandbox: %d", len(got))
	}
	if got, _ := e.p.List(ctx, store.RunFilter{Trigger: api.TriggerWebhook}); len(got) != 1 || got[0].ID != ids[2] {
		t.Fatalf("by trigger: %v", got)
	}
	if got, _ := e.p.List(ctx, store.RunFilter{Limit: 1}); len(got) != 1 || got[0].ID != ids[2] {
		t.Fatalf("limit: %v", got)
	}
	if got, _ := e.p.List(ctx, store.RunFilter{Since: t0.Add(time.Second)}); len(got) != 2 {
		t.Fatalf("since: %d", len(got))
	}
	e.p.Flush() // pruning works on what is on disk
	if err := e.st.PruneRuns(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.p.List(ctx, store.RunFilter{}); len(got) != 1 || got[0].ID != ids[2] {
		t.Fatalf("prune keeps the newest: %v", got)
	}
}

func TestUsageAggregatesByTrigger(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	e.sbx.burn = 2 * time.Second
	for _, trig := range []string{api.TriggerAPI, api.TriggerAPI, api.TriggerSchedule} {
		exe, err := e.p.Execute(ctx, Run{Trigger: trig, Who: "w", SandboxID: sb.ID, Exec: api.ExecRequest{Command: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, exe, nil)
	}
	if _, err := e.p.runAction(ctx, api.TriggerWebhook, "hook:h", "", api.RunAction{Command: "x"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	u, err := e.p.Usage(ctx, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Tenants) != 1 || u.Tenants[0].Tenant != DefaultTenant || u.Tenants[0].Totals.Runs != 4 || u.Tenants[0].Totals.CPUSeconds != 8 {
		t.Fatalf("tenant totals %+v", u.Tenants)
	}
	bt := u.Tenants[0].Totals.ByTrigger
	if bt[api.TriggerAPI].Runs != 2 || bt[api.TriggerAPI].CPUSeconds != 4 || bt[api.TriggerSchedule].Runs != 1 || bt[api.TriggerWebhook].Runs != 1 {
		t.Fatalf("by trigger %+v", bt)
	}
	if len(u.Sandboxes) != 2 {
		t.Fatalf("sandboxes %+v", u.Sandboxes)
	}
	one, _ := e.p.Usage(ctx, sb.ID, time.Time{})
	if len(one.Sandboxes) != 1 || one.Sandboxes[0].Totals.Runs != 3 {
		t.Fatalf("one sandbox %+v", one)
	}
	var lines []api.UsageRecord
	if err := e.p.ExportUsage(ctx, "", time.Time{}, func(r api.UsageRecord) error { lines = append(lines, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 4 || lines[0].Trigger != api.TriggerAPI || lines[3].Trigger != api.TriggerWebhook || lines[0].CPUSeconds != 2 {
		t.Fatalf("export oldest first: %+v", lines)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Sandboxes made for single runs that no live run owns (the daemon
// stopped during the run) are deleted at start-up; others are left alone.
func TestReapOrphans(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	orphan, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{LabelRun: "run_gone"}})
	user, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{Labels: map[string]string{"team": "x"}})
	named, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "nightly"})
	e.sbx.hold = make(chan struct{})
	exe, err := e.p.startAction(ctx, api.TriggerSchedule, "schedule:s", "", api.RunAction{Command: "x"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.p.ReapOrphans(ctx)
	if len(e.sbx.deleted) != 1 || e.sbx.deleted[0] != orphan.ID {
		t.Fatalf("deleted %v, want only %s", e.sbx.deleted, orphan.ID)
	}
	for _, id := range []string{user.ID, named.ID, exe.Sandbox} {
		if _, err := e.sbx.LookupSandbox(ctx, id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	close(e.sbx.hold)
	if _, err := e.p.Wait(ctx, exe); err != nil {
		t.Fatal(err)
	}
}
