package replay

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

func ip(i int) *int { return &i }

// record is a sandbox's flight record with one foreground run per cmd.
type fakeWorld struct {
	events  map[string][]api.SandboxEvent
	ckTime  time.Time
	forks   int
	deleted []string
	// result is what a re-run of argv[0] ends with and writes.
	result func(args []string) (exit int, digest string, files []api.FileEvent)
	runs   int
}

func (w *fakeWorld) Events(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error) {
	evs, ok := w.events[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	var out []api.SandboxEvent
	for _, ev := range evs {
		if q.Match(ev) {
			out = append(out, ev)
		}
	}
	return out, nil
}

func (w *fakeWorld) GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error) {
	if cid != "ck1" {
		return api.Checkpoint{}, errdefs.ErrNotFound
	}
	return api.Checkpoint{ID: "ck1", CreatedAt: w.ckTime}, nil
}

func (w *fakeWorld) ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error) {
	if cid != "ck1" {
		return api.ForkResult{}, errdefs.ErrNotFound
	}
	w.forks++
	w.events["fork"] = nil
	return api.ForkResult{Checkpoint: "ck1", Sandboxes: []api.Sandbox{{ID: "fork"}}}, nil
}

func (w *fakeWorld) Diff(ctx context.Context, from, to string, opts api.DiffOptions) (api.Diff, error) {
	return api.Diff{From: from, To: to}, nil
}

func (w *fakeWorld) DeleteSandbox(ctx context.Context, id string) error {
	w.deleted = append(w.deleted, id)
	return nil
}

type doneStream struct{ n int }

func (s *doneStream) Next() (api.ExecEvent, error) {
	s.n++
	if s.n > 1 {
		return api.ExecEvent{}, io.EOF
	}
	return api.ExecEvent{Type: api.EventExit, ExitCode: ip(0)}, nil
}
func (s *doneStream) Close() error { return nil }

func (w *fakeWorld) RunReplay(ctx context.Context, id string, req api.ExecRequest) (string, execstream.Stream, error) {
	w.runs++
	run := "replay" + string(rune('0'+w.runs))
	exit, digest, files := w.result(req.Cmd)
	w.events[id] = append(w.events[id], runEvents(run, req.Cmd, time.Now(), exit, digest, files)...)
	return run, &doneStream{}, nil
}

func runEvents(run string, args []string, at time.Time, exit int, digest string, files []api.FileEvent) []api.SandboxEvent {
	evs := []api.SandboxEvent{{Time: at, RunID: run, Type: api.EventRunStarted, Run: &api.RunEvent{Command: strings.Join(args, " "), Args: args, Mode: "foreground"}}}
	for _, f := range files {
		evs = append(evs, api.SandboxEvent{Time: at, RunID: run, Type: api.EventFileChanged, File: &f})
	}
	outcome := "ok"
	if exit != 0 {
		outcome = "nonzero"
	}
	return append(evs, api.SandboxEvent{Time: at, RunID: run, Type: api.EventRunEnded, Run: &api.RunEvent{Outcome: outcome, ExitCode: ip(exit), OutputSHA256: digest}})
}

func world(t *testing.T) *fakeWorld {
	t0 := time.Now().Add(-time.Hour)
	w := &fakeWorld{events: map[string][]api.SandboxEvent{}, ckTime: t0.Add(time.Minute)}
	var evs []api.SandboxEvent
	evs = append(evs, runEvents("before", []string{"setup"}, t0, 0, "d0", nil)...)
	evs = append(evs, api.SandboxEvent{Time: t0.Add(time.Minute), Type: "checkpoint"})
	evs = append(evs, runEvents("r1", []string{"write", "/a"}, t0.Add(2*time.Minute), 0, "d1", []api.FileEvent{{Path: "/a", Change: "created", Kind: "file", SHA256: "h1"}})...)
	evs = append(evs, api.SandboxEvent{Time: t0.Add(2 * time.Minute), RunID: "bg", Type: api.EventRunStarted, Run: &api.RunEvent{Command: "server", Mode: "background"}})
	evs = append(evs, runEvents("r2", []string{"check"}, t0.Add(3*time.Minute), 1, "d2", nil)...)
	evs = append(evs, runEvents("r3", []string{"report"}, t0.Add(4*time.Minute), 0, "d3", nil)...)
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
		evs[i].SandboxID = "sb"
	}
	w.events["sb"] = evs
	w.result = func(args []string) (int, string, []api.FileEvent) {
		switch args[0] {
		case "write":
			return 0, "d1", []api.FileEvent{{Path: "/a", Change: "modified", Kind: "file", SHA256: "h1"}}
		case "check":
			return 1, "d2", nil
		default:
			return 0, "d3", nil
		}
	}
	return w
}

func TestReplayNoDivergence(t *testing.T) {
	w := world(t)
	r := New(w, w, w, w, nil)
	res, err := r.Replay(context.Background(), "sb", api.ReplayRequest{Checkpoint: "ck1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Diverged || len(res.Steps) != 3 || res.FirstDivergence != nil {
		t.Fatalf("%+v", res)
	}
	if got := res.Steps[0].Original.Run + res.Steps[1].Original.Run + res.Steps[2].Original.Run; got != "r1r2r3" {
		t.Fatalf("steps %s: want the foreground runs after the checkpoint", got)
	}
	if len(w.deleted) != 1 || w.deleted[0] != "fork" || res.Kept {
		t.Fatalf("fork not deleted: %v", w.deleted)
	}
}

func TestReplayFirstDivergence(t *testing.T) {
	w := world(t)
	w.result = func(args []string) (int, string, []api.FileEvent) {
		switch args[0] {
		case "write":
			return 0, "d1", []api.FileEvent{{Path: "/a", Change: "created", Kind: "file", SHA256: "OTHER"}}
		case "check":
			return 1, "d2", nil
		}
		return 0, "d3", nil
	}
	r := New(w, w, w, w, nil)
	res, err := r.Replay(context.Background(), "sb", api.ReplayRequest{Checkpoint: "ck1", Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Diverged || res.FirstDivergence == nil || *res.FirstDivergence != 0 || len(res.Steps) != 1 {
		t.Fatalf("%+v", res)
	}
	if d := res.Steps[0].Differences; len(d) != 1 || !strings.Contains(d[0], "file /a: content") {
		t.Fatalf("differences %v", d)
	}
	if len(w.deleted) != 0 || !res.Kept {
		t.Fatal("a kept fork was deleted")
	}
	// Ignoring the path, and continuing, it matches.
	w = world(t)
	w.result = func(args []string) (int, string, []api.FileEvent) {
		if args[0] == "check" {
			return 0, "d2", nil
		}
		return 0, map[string]string{"write": "d1", "report": "d3"}[args[0]], nil
	}
	res, err = New(w, w, w, w, nil).Replay(context.Background(), "sb", api.ReplayRequest{Checkpoint: "ck1", Continue: true, IgnorePaths: []string{"/a"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Diverged || *res.FirstDivergence != 1 || len(res.Steps) != 3 || res.Steps[2].Diverged {
		t.Fatalf("%+v", res)
	}
	if d := res.Steps[1].Differences; len(d) != 1 || d[0] != "exit: nonzero (status 1), then ok (status 0)" {
		t.Fatalf("differences %q", d)
	}
}

func TestReplaySelection(t *testing.T) {
	w := world(t)
	r := New(w, w, w, w, nil)
	res, err := r.Replay(context.Background(), "sb", api.ReplayRequest{Checkpoint: "ck1", Runs: []string{"r3", "r1"}})
	if err != nil || len(res.Steps) != 2 || res.Steps[0].Original.Run != "r1" {
		t.Fatalf("%+v %v", res, err)
	}
	for _, req := range []api.ReplayRequest{
		{Checkpoint: "ck1", Runs: []string{"bg"}},
		{Checkpoint: "ck1", Runs: []string{"nope"}},
		{Checkpoint: "ck1", Since: 100},
		{},
		{Checkpoint: "ck1", StepTimeoutSeconds: -1},
	} {
		if _, err := r.Replay(context.Background(), "sb", req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("%+v: %v", req, err)
		}
	}
	if _, err := r.Replay(context.Background(), "sb", api.ReplayRequest{Checkpoint: "other"}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown checkpoint: %v", err)
	}
	if _, err := r.Replay(context.Background(), "nobody", api.ReplayRequest{Checkpoint: "ck1"}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	// A bad selection leaves no fork behind.
	if w.forks == 0 || w.forks != len(w.deleted) {
		t.Fatalf("%d forks, %d deleted", w.forks, len(w.deleted))
	}
}

func TestCompare(t *testing.T) {
	w := world(t)
	w.events["sb2"] = append([]api.SandboxEvent(nil), w.events["sb"]...)
	w.events["sb2"] = append(w.events["sb2"], runEvents("r4", []string{"extra"}, time.Now(), 0, "d4", nil)...)
	res, err := New(w, w, w, w, nil).Compare(context.Background(), "sb", "sb2")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Diverged || *res.FirstDivergence != 4 || len(res.Steps) != 5 || res.Steps[4].A != nil || res.Diff.From != "sandbox:sb" {
		t.Fatalf("%+v", res)
	}
}
