package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

func TestParseJournal(t *testing.T) {
	start := func(id string) string {
		return `{"op":"start","id":"` + id + `","run":{"id":"` + id + `","trigger":"api","state":"running","started_at":"2030-01-07T07:30:00Z"},"ephemeral":true}`
	}
	data := start("run_a") + "\n" +
		start("run_b") + "\n" +
		`{"op":"pid","id":"run_a","pid":42}` + "\n" +
		`{"op":"end","id":"run_b"}` + "\n" +
		`{"op":"pid","id":"run_x","pid":7}` + "\n" + // never started
		`{"op":"start","id":"run_c","run":{"id":"other"}}` + "\n" + // id mismatch
		`not json` + "\n" +
		start("run_d") + "\n" +
		`{"op":"pid","id":"run_d","pid":-3}` + "\n" +
		`{"op":"end","id":"run_d"`
	got := parseJournal([]byte(data))
	var ids []string
	for _, r := range got {
		ids = append(ids, r.start.ID)
	}
	// run_d's end is torn: it is still open.
	if !slices.Equal(ids, []string{"run_a", "run_d"}) {
		t.Fatalf("open runs %v", ids)
	}
	if got[0].pid != 42 || !got[0].start.Ephemeral || got[0].start.Run.Trigger != api.TriggerAPI {
		t.Errorf("run_a: %+v", got[0])
	}
	if got[1].pid != 0 {
		t.Errorf("run_d takes a negative pid: %+v", got[1])
	}
}

func FuzzParseJournal(f *testing.F) {
	f.Add([]byte(`{"op":"start","id":"run_a","run":{"id":"run_a"}}` + "\n" + `{"op":"pid","id":"run_a","pid":1}` + "\n"))
	f.Add([]byte(`{"op":"end","id":"run_a"}`))
	f.Add([]byte("\n\n{\"op\":\"start\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		runs := parseJournal(data)
		seen := map[string]bool{}
		for _, r := range runs {
			if r.start.Op != journalStart || r.start.Run == nil || r.start.Run.ID != r.start.ID || r.start.ID == "" {
				t.Fatalf("open run without a valid start: %+v", r)
			}
			if seen[r.start.ID] {
				t.Fatalf("run %s listed twice", r.start.ID)
			}
			seen[r.start.ID] = true
			if r.pid < 0 {
				t.Fatalf("negative pid %d", r.pid)
			}
		}
		// What parses is written back by a rewrite and parses the same.
		open := map[string]*openRun{}
		for i := range runs {
			open[runs[i].start.ID] = &runs[i]
		}
		again := parseJournal(encodeOpen(open).Bytes())
		if len(again) != len(runs) {
			t.Fatalf("rewritten journal has %d open runs, want %d", len(again), len(runs))
		}
		for _, r := range again {
			if o := open[r.start.ID]; o == nil || o.pid != r.pid {
				t.Fatalf("run %s came back as %+v", r.start.ID, r)
			}
		}
	})
}

// journalEnv is an env whose pipeline keeps a run journal.
func journalEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "runs.journal")
	e.p = e.newJournaled(t, path)
	return e, path
}

func (e *env) newJournaled(t *testing.T, path string) *Pipeline {
	t.Helper()
	p, err := New(Config{Sandboxes: e.sbx, Store: e.st, Clock: e.clk, JournalPath: path})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A daemon killed during runs leaves them in the journal; the next
// pipeline reconciles each: still running (finished when it exits, metered
// from its start), exited meanwhile (finished with the guest's exit
// code), or gone (lost), and deletes a run's own sandbox after it.
func TestRecoverRunsAfterKill(t *testing.T) {
	e, path := journalEnv(t)
	ctx := context.Background()
	e.sbx.hold = make(chan struct{}) // the old daemon sees no exit
	e.sbx.burn = 2 * time.Second
	sbRunning, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	sbGone, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	start := func(r Run, readStarted bool) string {
		t.Helper()
		exe, err := e.p.Execute(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if readStarted {
			if ev, err := exe.Stream.Next(); err != nil || ev.Type != api.EventStarted {
				t.Fatalf("first event %+v %v", ev, err)
			}
		}
		return exe.ID
	}
	cmd := api.ExecRequest{Cmd: []string{"sleep", "60"}}
	running := start(Run{Trigger: api.TriggerAPI, SandboxID: sbRunning.ID, Exec: cmd}, true)
	gone := start(Run{Trigger: api.TriggerAPI, SandboxID: sbGone.ID, Exec: cmd}, true)
	noPid := start(Run{Trigger: api.TriggerAPI, SandboxID: sbRunning.ID, Exec: cmd}, false)
	ephemeral := start(Run{Trigger: api.TriggerSchedule, Create: &api.CreateSandboxRequest{}, Exec: cmd, KeepOutput: true}, true)
	ephemeralBox := e.sbx.boxes["sb3"]

	// SIGKILL: the old pipeline is abandoned as it is. During the outage
	// one sandbox goes away.
	if _, err := e.st.GetRun(ctx, running); err == nil {
		t.Fatal("a running run is in the store already")
	}
	delete(e.sbx.boxes, sbGone.ID)
	e.sbx.hold = nil
	e.sbx.watchHold = make(chan struct{})
	e.sbx.exitCode = 5 // what the guest kept
	e.clk.Advance(30 * time.Second)
	p := e.newJournaled(t, path)
	p.Recover(ctx)

	for _, id := range []string{running, ephemeral} {
		if r, err := p.Get(ctx, id); err != nil || r.State != api.RunRunning {
			t.Errorf("run %s after the restart: %+v %v", id, r, err)
		}
	}
	waitState := func(id, state string) api.Run {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			r, err := p.Get(ctx, id)
			if err == nil && r.State == state {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s: %+v %v, want %s", id, r, err, state)
			}
		}
	}
	for _, id := range []string{gone, noPid} {
		if r := waitState(id, api.RunLost); r.Error == "" || r.EndedAt == nil {
			t.Errorf("lost run %s: %+v", id, r)
		}
	}
	close(e.sbx.watchHold)
	r := waitState(running, api.RunFinished)
	if r.ExitCode == nil || *r.ExitCode != 5 || r.DurationSeconds != 30 || r.Usage.CPUSeconds != 2 {
		t.Errorf("recovered run: exit %v, %v s, usage %+v", r.ExitCode, r.DurationSeconds, r.Usage)
	}
	waitState(ephemeral, api.RunFinished)
	p.Flush()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.sbx.mu.Lock()
		_, left := e.sbx.boxes[ephemeralBox.ID]
		e.sbx.mu.Unlock()
		if !left {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a recovered run's own sandbox was not deleted after it")
		}
	}
	for _, id := range []string{running, gone, noPid, ephemeral} {
		if r, err := e.st.GetRun(ctx, id); err != nil || r.State == api.RunRunning {
			t.Errorf("stored record of %s: %+v %v", id, r, err)
		}
	}
	// Nothing is left open for a third daemon.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_, open, err := openJournal(path)
	if err != nil || len(open) != 0 {
		t.Fatalf("open runs after reconciling: %+v %v", open, err)
	}
}

// The journal is rewritten once it grows, keeping only open runs.
func TestJournalCompacts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.journal")
	j, _, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	big := api.Run{ID: "run_keep", Cmd: []string{string(make([]byte, 1000))}}
	if err := j.started(big, false, false, &runtime.Stats{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := j.pid("run_keep", 9); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3000; i++ {
		r := api.Run{ID: "run_x", Cmd: []string{string(make([]byte, 300))}}
		if err := j.started(r, false, false, nil, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := j.ended("run_x"); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > journalCompactBytes+4<<10 {
		t.Errorf("journal of %d bytes was not compacted", fi.Size())
	}
	data, _ := os.ReadFile(path)
	open := parseJournal(data)
	if len(open) != 1 || open[0].start.ID != "run_keep" || open[0].pid != 9 {
		t.Errorf("open runs after compaction: %+v", open)
	}
}

// A run that cannot be journaled is not started: it would go unrecorded
// if the daemon were killed during it.
func TestExecuteRefusedWithoutJournal(t *testing.T) {
	e, _ := journalEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err := e.p.journal.close(); err != nil {
		t.Fatal(err)
	}
	_, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, SandboxID: sb.ID, Exec: api.ExecRequest{Cmd: []string{"true"}}})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Execute with a broken journal = %v, want ErrUnavailable", err)
	}
	if n := e.sbx.execCount(); n != 0 {
		t.Fatalf("%d commands started without a journal entry", n)
	}
}

// A run whose finished record reached the store just before the daemon
// was killed (its end not journaled yet) is left as stored.
func TestRecoverKeepsStoredRecord(t *testing.T) {
	e, path := journalEnv(t)
	ctx := context.Background()
	sb, _ := e.sbx.CreateSandbox(ctx, api.CreateSandboxRequest{})
	e.sbx.exitCode = 3
	exe, err := e.p.Execute(ctx, Run{Trigger: api.TriggerAPI, SandboxID: sb.ID, Exec: api.ExecRequest{Cmd: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, exe, nil)
	e.p.Flush()
	stored, err := e.st.GetRun(ctx, exe.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The end line is lost: the journal is cut back to before it.
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
	if !strings.Contains(lines[len(lines)-1], `"end"`) {
		t.Fatalf("last journal line %q", lines[len(lines)-1])
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines[:len(lines)-1], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	e.sbx.exitCode = 9
	p := e.newJournaled(t, path)
	p.Recover(ctx)
	p.Flush()
	r, err := p.Get(ctx, exe.ID)
	if err != nil || r.State != api.RunFinished || *r.ExitCode != 3 || !r.EndedAt.Equal(*stored.EndedAt) {
		t.Fatalf("record after recovery %+v %v, want the stored one %+v", r, err, stored)
	}
	_ = p.Close()
	if _, open, err := openJournal(path); err != nil || len(open) != 0 {
		t.Fatalf("open runs: %+v %v", open, err)
	}
}
