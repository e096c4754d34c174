// Package replay re-runs a sandbox's recorded runs from a checkpoint in a
// fresh fork and reports where they first diverge, and compares two
// sandboxes' runs and files side by side (issue 16 item 4).
//
// It is a feature over the core, not an extension: it has no hook. It reads
// the flight recorder's query API (what each run was and did), forks
// through the checkpoint feature, runs every step through the execution
// pipeline (the daemon's Runner: trigger "replay", so a re-run is a run
// like any other, metered and recorded) and diffs through the checkpoint
// feature. The core does not import it; the daemon builds it.
//
// What a step compares, from the flight record of the original run and of
// its re-run: the outcome with its exit code or signal, the digest of the
// output (stdout and stderr interleaved as they arrived, redacted), and
// the file effects (path, change, kind, mode, content digest), minus the
// caller's ignored prefixes. Not recorded, so not replayed: the runs'
// stdin, their own environment variables (the fork has the source
// sandbox's), background processes; secrets are given again by name.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// Bounds.
const (
	// MaxSteps bounds the runs one replay re-runs.
	MaxSteps = 200
	// DefaultStepTimeout bounds each re-run command unless the request
	// says otherwise; MaxStepTimeout bounds what it may say.
	DefaultStepTimeout = 5 * time.Minute
	MaxStepTimeout     = time.Hour
	// maxEvents bounds the events read of one sandbox's record.
	maxEvents = 200_000
	// maxDifferences bounds the differences named per step.
	maxDifferences = 20
)

// Events is the flight recorder's query API (audit.Recorder.Events): a
// sandbox's recorded events as the caller of ctx may see them, oldest
// first, once the effects of runs that returned are recorded.
type Events interface {
	Events(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error)
}

// Snapshots is what replay needs of the checkpoint feature
// (snapshot.Snapshots), with its contracts.
type Snapshots interface {
	GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error)
	ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error)
	Diff(ctx context.Context, fromRef, toRef string, opts api.DiffOptions) (api.Diff, error)
}

// Runner runs one foreground command in a sandbox through the execution
// pipeline, as the caller of ctx, and returns the run's id (the id the
// flight recorder files it under) and its stream, which the caller reads
// to its end and closes.
type Runner interface {
	RunReplay(ctx context.Context, sandboxID string, req api.ExecRequest) (runID string, s execstream.Stream, err error)
}

// Deleter deletes a sandbox (sandbox.Manager.DeleteSandbox).
type Deleter interface {
	DeleteSandbox(ctx context.Context, id string) error
}

// Replayer serves replay and compare. Safe for concurrent use.
type Replayer struct {
	events Events
	snaps  Snapshots
	run    Runner
	del    Deleter
	log    *slog.Logger
}

// New returns a Replayer logging to log (nil: nowhere).
func New(events Events, snaps Snapshots, run Runner, del Deleter, log *slog.Logger) *Replayer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Replayer{events: events, snaps: snaps, run: run, del: del, log: log}
}

// LabelReplayOf marks a replay's fork with the sandbox it replays.
const LabelReplayOf = "agentbox.replay-of"

// Replay re-runs sandbox id's recorded runs selected by req in a fresh fork
// of req.Checkpoint, one after the other, comparing each with its
// original (see the package doc). It stops at the first divergence unless
// req.Continue. The fork is deleted at the end unless req.Keep (also on
// error). Errors: ErrInvalidArgument for a bad request or a run id not in
// the record, ErrNotFound for an unknown sandbox or checkpoint (another
// tenant's included), what forking fails with; a step that cannot run is a
// divergent step, not an error.
func (r *Replayer) Replay(ctx context.Context, id string, req api.ReplayRequest) (api.ReplayResult, error) {
	if req.Checkpoint == "" {
		return api.ReplayResult{}, fmt.Errorf("replay: checkpoint is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(req.Runs) > MaxSteps || len(req.IgnorePaths) > 64 {
		return api.ReplayResult{}, fmt.Errorf("replay: at most %d runs and 64 ignored paths: %w", MaxSteps, errdefs.ErrInvalidArgument)
	}
	timeout := DefaultStepTimeout
	if req.StepTimeoutSeconds < 0 || req.StepTimeoutSeconds > MaxStepTimeout.Seconds() {
		return api.ReplayResult{}, fmt.Errorf("replay: step_timeout_seconds must be between 0 and %.0f: %w", MaxStepTimeout.Seconds(), errdefs.ErrInvalidArgument)
	} else if req.StepTimeoutSeconds > 0 {
		timeout = time.Duration(req.StepTimeoutSeconds * float64(time.Second))
	}
	evs, err := r.events.Events(ctx, id, api.EventQuery{Limit: maxEvents})
	if err != nil {
		return api.ReplayResult{}, fmt.Errorf("replay of %s: %w", id, err)
	}
	runs := Runs(evs)
	// Forked first: the fork resolves the checkpoint (an id or the
	// caller's name) as everywhere else, and its id dates it.
	fr, err := r.snaps.ForkCheckpoint(ctx, req.Checkpoint, api.ForkRequest{Labels: map[string]string{LabelReplayOf: id}})
	if err != nil {
		return api.ReplayResult{}, fmt.Errorf("replay of %s: forking %s: %w", id, req.Checkpoint, err)
	}
	if len(fr.Sandboxes) != 1 {
		return api.ReplayResult{}, fmt.Errorf("replay of %s: fork made %d sandboxes: %w", id, len(fr.Sandboxes), errdefs.ErrInternal)
	}
	fork := fr.Sandboxes[0].ID
	keep := false
	defer func() {
		if keep {
			return
		}
		dctx := context.WithoutCancel(ctx)
		if err := r.del.DeleteSandbox(dctx, fork); err != nil && !errdefs.IsNotFound(err) {
			r.log.WarnContext(dctx, "deleting a replay's fork", "sandbox", id, "fork", fork, "err", err)
		}
	}()
	ck, err := r.snaps.GetCheckpoint(ctx, fr.Checkpoint)
	if err != nil {
		return api.ReplayResult{}, fmt.Errorf("replay of %s: %w", id, err)
	}
	steps, err := selectRuns(runs, req, ck)
	if err != nil {
		return api.ReplayResult{}, fmt.Errorf("replay of %s: %w", id, err)
	}
	keep = req.Keep
	res := api.ReplayResult{Sandbox: id, Checkpoint: fr.Checkpoint, Fork: fork, Kept: req.Keep, Steps: []api.ReplayStep{}}
	for i, orig := range steps {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("replay of %s: %w", id, err)
		}
		st := api.ReplayStep{Index: i, Original: orig.RunSummary}
		rep, err := r.step(ctx, fork, orig, timeout)
		if err != nil {
			st.Diverged, st.Error = true, err.Error()
			st.Differences = []string{"the run could not be replayed: " + err.Error()}
		} else {
			st.Replayed = &rep
			st.Differences = Differences(orig.RunSummary, rep, req.IgnorePaths)
			st.Diverged = len(st.Differences) > 0
		}
		res.Steps = append(res.Steps, st)
		if st.Diverged && !res.Diverged {
			res.Diverged, res.FirstDivergence = true, &st.Index
			if !req.Continue {
				break
			}
		}
	}
	return res, nil
}

// selectRuns picks the recorded foreground runs to replay.
func selectRuns(runs []Recorded, req api.ReplayRequest, ck api.Checkpoint) ([]Recorded, error) {
	var out []Recorded
	if len(req.Runs) > 0 {
		want := map[string]bool{}
		for _, id := range req.Runs {
			want[id] = true
		}
		for _, s := range runs {
			if want[s.Run] && s.Seq > req.Since {
				out = append(out, s)
				delete(want, s.Run)
			}
		}
		if len(want) > 0 {
			var missing []string
			for id := range want {
				missing = append(missing, id)
			}
			slices.Sort(missing)
			return nil, fmt.Errorf("runs not in the sandbox's record as foreground runs (after %d): %s: %w", req.Since, strings.Join(missing, ", "), errdefs.ErrInvalidArgument)
		}
		return out, nil
	}
	for _, s := range runs {
		if s.Seq > req.Since && (ck.CreatedAt.IsZero() || !s.Started.Before(ck.CreatedAt)) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no recorded foreground run after the checkpoint to replay: %w", errdefs.ErrInvalidArgument)
	}
	if len(out) > MaxSteps {
		return nil, fmt.Errorf("%d runs to replay, at most %d: name them (runs) or narrow them (since): %w", len(out), MaxSteps, errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// step re-runs one recorded run in the fork and reads what its re-run did
// from the fork's record.
func (r *Replayer) step(ctx context.Context, fork string, orig Recorded, timeout time.Duration) (api.RunSummary, error) {
	req := api.ExecRequest{Cwd: orig.Cwd, User: orig.User, TimeoutSeconds: timeout.Seconds()}
	switch {
	case len(orig.Args) > 0:
		req.Cmd = orig.Args
	case orig.Command != "":
		// A shell command line (or a record from before argv was kept).
		req.Command = orig.Command
	default:
		return api.RunSummary{}, errors.New("its command was not recorded in full")
	}
	for _, c := range orig.Credentials {
		req.Secrets = append(req.Secrets, api.ExecSecret{Name: c})
	}
	runID, s, err := r.run.RunReplay(ctx, fork, req)
	if err != nil {
		return api.RunSummary{}, err
	}
	for {
		ev, err := s.Next()
		if err == io.EOF || (err == nil && execstream.Final(ev)) {
			break
		}
		if err != nil {
			_ = s.Close()
			return api.RunSummary{}, fmt.Errorf("following the re-run: %w", err)
		}
	}
	_ = s.Close()
	evs, err := r.events.Events(ctx, fork, api.EventQuery{Run: runID, Limit: maxEvents})
	if err != nil {
		return api.RunSummary{}, fmt.Errorf("reading the re-run's record: %w", err)
	}
	got := Runs(evs)
	if len(got) != 1 {
		return api.RunSummary{}, fmt.Errorf("the re-run %s is not in the fork's record", runID)
	}
	return got[0].RunSummary, nil
}
