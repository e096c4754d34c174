package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/tracectx"
)

// Following runs.
//
// A foreground run is recorded in two steps. WrapExec records run.started
// and takes the "before" listing of the sandbox's writable layer. When
// the run's final event passes, the caller gets it at once and a
// goroutine lists the layer again and records run.ended, then the files
// and packages the run changed. The next run of the sandbox waits for
// that goroutine before it starts (so effects are in order and never
// attributed to the wrong run), and starts from its "after" listing
// instead of walking the layer again, unless something else may have
// changed the layer since (fsState.gen: a file API write, a background
// process start, a restore, a checkpoint, a transition) or another run is
// in progress. What processes left running in the background change
// between two runs is attributed to the next run (docs/AUDIT.md).

// fsState is what the recorder keeps of one sandbox's writable layer
// between runs.
type fsState struct {
	// mu guards the fields below.
	mu sync.Mutex
	// listing is the layer as of the end of the last run (nil: unknown),
	// of upper dir upper, with apk the apk database then. tracked says
	// instead that the change tracker's baseline is the layer as of the
	// end of the last run (which it followed).
	listing *listing
	tracked bool
	upper   string
	apk     map[string]string
	// tracking is the upper dir the change tracker follows for the
	// sandbox (forgotten with the sandbox, or when it changes).
	tracking string
	// gen counts the events that may have changed the layer outside a
	// run; an "after" listing taken before a change is not kept.
	gen uint64
	// pending is closed when the effects of the last ended run are
	// recorded (nil: none pending).
	pending chan struct{}
}

// fsOf returns sandbox id's state, made on first use.
func (r *Recorder) fsOf(id string) *fsState {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.fs[id]
	if st == nil {
		st = &fsState{}
		r.fs[id] = st
	}
	return st
}

// invalidate forgets sandbox id's listing: its layer may have changed
// outside a run.
func (r *Recorder) invalidate(id string) {
	r.mu.Lock()
	st := r.fs[id]
	r.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	st.listing, st.tracked = nil, false
	st.gen++
	st.mu.Unlock()
}

// waitPending waits until the effects of sandbox id's ended runs are
// recorded, or ctx ends.
func (st *fsState) waitPending(ctx context.Context) {
	st.mu.Lock()
	p := st.pending
	st.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p:
	case <-ctx.Done():
	}
}

// readOnlyGuestCall reports whether a guest call (Op.Detail, see
// internal/sandboxfiles) changes nothing in the sandbox.
func readOnlyGuestCall(detail string) bool {
	for _, p := range []string{"reading ", "stat ", "listing ", "archiving ", "resizing "} {
		if strings.HasPrefix(detail, p) {
			return true
		}
	}
	return false
}

// WrapExec implements sandbox.ExecWrapper: it records the run's start
// (its command, cwd, user and the names of the secrets it was given),
// takes the "before" listing of a foreground run and follows the run to
// its end. It never changes req and never fails. It must be registered
// before the secrets' wrapper (which clears req.Secrets), so that its
// stream is the outer one and sees the output redacted.
func (r *Recorder) WrapExec(ctx context.Context, h *sandbox.Handle, req *api.ExecRequest) (sandbox.ExecRun, error) {
	id := h.ID()
	run := sandbox.RunIDFrom(ctx)
	if run == "" {
		run = sandbox.NewRunID()
	}
	var creds []string
	for _, s := range req.Secrets {
		creds = append(creds, s.Name)
	}
	mode := "foreground"
	if req.Background {
		mode = "background"
	}
	cmd := req.Command
	if cmd == "" {
		cmd = joinArgs(req.Cmd)
	}
	e := &execRun{r: r, h: h, ctx: context.WithoutCancel(ctx), id: id, owner: h.Owner(), run: run,
		background: req.Background, start: time.Now(), actor: tenant.From(ctx).String()}
	st := r.fsOf(id)
	st.waitPending(ctx)
	if req.Background {
		r.invalidate(id)
	} else {
		e.st = st
		e.upper, e.lowers = h.Dirs()
		concurrent := r.liveCount(id) > 0
		st.mu.Lock()
		same := st.upper == e.upper && !concurrent
		reuseListing, reuseTracked := same && st.listing != nil, same && st.tracked
		if reuseListing {
			e.before = *st.listing
		}
		if reuseListing || reuseTracked {
			e.apkBefore = st.apk
		}
		// Taken: a run beside this one walks for itself.
		st.listing, st.tracked = nil, false
		st.mu.Unlock()
		walked := false
		if r.trk != nil && !concurrent && e.upper != "" && !reuseTracked && !reuseListing {
			// The layer must be listed anyway: its size decides below.
			e.before, walked = scanUpper(e.upper, r.scan.Entries), true
		}
		// A small layer is walked rather than tracked: listing a few
		// hundred entries costs less than the tracker's barrier. The size
		// is judged whenever the recorder has a listing (the last run's
		// end, or one taken now because the layer changed outside runs);
		// a layer whose last run was tracked stays tracked.
		small := !reuseTracked && !e.before.truncated && len(e.before.files) < r.scan.TrackFrom && (walked || reuseListing)
		if r.trk != nil && !concurrent && e.upper != "" && !small {
			// Without reuse, what changed since the last run was done
			// outside runs: folded in, not reported.
			if err := r.trk.begin(ctx, e.upper, !reuseTracked); err == nil {
				e.tracked = true
				st.mu.Lock()
				old := st.tracking
				st.tracking = e.upper
				st.mu.Unlock()
				if old != "" && old != e.upper {
					r.trk.forget(old)
				}
			} else {
				r.log.DebugContext(ctx, "audit: run not tracked; walking its writable layer", "sandbox", id, "err", err)
			}
		}
		if !(e.tracked && reuseTracked) && !(!e.tracked && reuseListing) {
			if !e.tracked && !walked {
				e.before = scanUpper(e.upper, r.scan.Entries)
			}
			e.apkBefore = findAPK(append([]string{e.upper}, e.lowers...))
		}
		if s, err := h.Stats(ctx); err == nil {
			e.cpu0, e.haveCPU = s.CPUTime, true
		}
		r.setLive(id, run, true)
	}
	r.record(ctx, e.owner, api.SandboxEvent{SandboxID: id, RunID: run, Type: api.EventRunStarted, Actor: e.actor,
		Run: &api.RunEvent{Command: cmd, Args: recordedArgs(req.Cmd), Cwd: req.Cwd, User: req.User, Mode: mode, Credentials: creds, TraceParent: tracectx.Parent(ctx)}})
	return e, nil
}

// recordedArgs is the argv a run.started keeps: all of it, or nothing
// when it is longer than a command is kept.
func recordedArgs(args []string) []string {
	n := 0
	for _, a := range args {
		n += len(a) + 1
	}
	if len(args) == 0 || n > maxCommand {
		return nil
	}
	return append([]string(nil), args...)
}

func joinArgs(args []string) string {
	return strings.Join(args, " ")
}

// execRun follows one process (sandbox.ExecRun).
type execRun struct {
	r          *Recorder
	h          *sandbox.Handle
	ctx        context.Context
	id, owner  string
	run, actor string
	background bool
	start      time.Time

	// Foreground runs only.
	st *fsState
	// tracked: the change tracker follows the run (else before is the
	// layer's listing at its start).
	tracked   bool
	upper     string
	lowers    []string
	before    listing
	apkBefore map[string]string
	cpu0      time.Duration
	haveCPU   bool
}

// Abort implements sandbox.ExecRun.
func (e *execRun) Abort() {
	if !e.background {
		e.r.setLive(e.id, e.run, false)
	}
	e.r.record(e.ctx, e.owner, api.SandboxEvent{SandboxID: e.id, RunID: e.run, Type: api.EventRunEnded, Actor: e.actor,
		Run: &api.RunEvent{Outcome: "not_started", DurationMS: msSince(e.start)}})
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// Started implements sandbox.ExecRun.
func (e *execRun) Started(pid int, s execstream.Stream) execstream.Stream {
	if s == nil || e.background {
		return nil
	}
	e.r.setPid(e.id, e.run, pid)
	return &recStream{Stream: s, e: e, sum: sha256.New()}
}

// recStream passes a foreground exec's events through, digesting its
// output, and ends the run at its final event (or when it is closed
// before one).
type recStream struct {
	execstream.Stream
	e       *execRun
	sum     hash.Hash
	n       int64
	excerpt []byte
	trimmed bool
	once    sync.Once
}

func (t *recStream) Next() (api.ExecEvent, error) {
	ev, err := t.Stream.Next()
	if err != nil {
		t.once.Do(func() { t.e.end(nil, "abandoned", t) })
		return ev, err
	}
	if (ev.Type == api.EventStdout || ev.Type == api.EventStderr) && len(ev.Data) > 0 {
		t.sum.Write(ev.Data)
		t.n += int64(len(ev.Data))
		room := maxExcerpt - len(t.excerpt)
		if len(ev.Data) > room {
			t.trimmed = true
		}
		if room > 0 {
			t.excerpt = append(t.excerpt, ev.Data[:min(room, len(ev.Data))]...)
		}
	}
	if execstream.Final(ev) {
		t.once.Do(func() { t.e.end(&ev, "", t) })
	}
	return ev, nil
}

func (t *recStream) Close() error {
	t.once.Do(func() { t.e.end(nil, "abandoned", t) })
	return t.Stream.Close()
}

// outcomeOf classifies a final event like the metrics do.
func outcomeOf(ev api.ExecEvent) string {
	switch {
	case ev.Type == api.EventError:
		return "error"
	case ev.OOMKilled:
		return "oom"
	case ev.TimedOut:
		return "timeout"
	case ev.Signal != "":
		return "signal"
	case ev.ExitCode != nil && *ev.ExitCode == 0:
		return "ok"
	default:
		return "nonzero"
	}
}

// end ends a foreground run (final is its final event, nil when there is
// none; outcome then says why): it is no longer live at once, and its
// end and effects are recorded by a goroutine the sandbox's next run
// waits for.
func (e *execRun) end(final *api.ExecEvent, outcome string, out *recStream) {
	e.r.setLive(e.id, e.run, false)
	run := &api.RunEvent{DurationMS: msSince(e.start), Outcome: outcome}
	ev := api.SandboxEvent{Time: time.Now().UTC(), SandboxID: e.id, RunID: e.run, Type: api.EventRunEnded, Actor: e.actor, Run: run}
	if final != nil {
		run.Outcome = outcomeOf(*final)
		run.ExitCode, run.Signal, run.TimedOut, run.OOMKilled = final.ExitCode, final.Signal, final.TimedOut, final.OOMKilled
		if final.Error != nil {
			ev.Error = final.Error.Message
		}
	}
	if out != nil {
		run.OutputBytes = out.n
		run.OutputSHA256 = hex.EncodeToString(out.sum.Sum(nil))
		run.Excerpt = string(out.excerpt)
		run.ExcerptTrimmed = out.trimmed
	}
	rolledBack := final != nil && final.RolledBack
	st := e.st
	done := make(chan struct{})
	st.mu.Lock()
	prev := st.pending
	st.pending = done
	gen := st.gen
	st.mu.Unlock()
	e.r.wg.Add(1)
	go func() {
		defer e.r.wg.Done()
		defer close(done)
		if prev != nil {
			<-prev
		}
		e.effects(ev, rolledBack, gen)
	}()
}

// effects records run.ended (ev) and the files and packages the run
// changed, and keeps the "after" listing for the next run when nothing
// else changed the layer since gen.
func (e *execRun) effects(ev api.SandboxEvent, rolledBack bool, gen uint64) {
	ctx, run, lim := e.ctx, ev.Run, e.r.scan
	if e.haveCPU {
		if s, err := e.h.Stats(ctx); err == nil && s.CPUTime >= e.cpu0 {
			run.CPUSeconds = (s.CPUTime - e.cpu0).Seconds()
		}
	}
	var files []api.FileEvent
	var pkgs []api.PackageEvent
	upper, _ := e.h.Dirs()
	if e.tracked && (rolledBack || upper != e.upper) {
		// A rollback replaced the layer: the tracker's view is stale.
		e.r.trk.forget(e.upper)
	}
	if upper == e.upper && !rolledBack {
		var raw []fileChange
		var after listing
		tracked := e.tracked
		if tracked {
			var err error
			if raw, _, err = e.r.trk.end(ctx, upper); err != nil {
				e.r.log.WarnContext(ctx, "audit: the change tracker lost the writable layer; its changes in this run are not recorded", "sandbox", e.id, "err", err)
				run.FilesTruncated = true
				tracked = false
			}
		} else {
			after = scanUpper(upper, lim.Entries)
			run.FilesTruncated = e.before.truncated || after.truncated
			raw = diffListings(e.before, after)
		}
		changes := resolveCopyUps(raw, e.lowers)
		budget := lim.HashRun
		for i, c := range changes {
			if i >= lim.Events {
				run.FilesOmitted = len(changes) - i
				break
			}
			files = append(files, fileEvent(upper, c, lim, &budget))
		}
		pkgs = packageChanges(upper, changes, e.apkBefore)
		apk := e.apkBefore
		for _, c := range changes {
			if c.rel == apkDB {
				apk = readAPK(upper, apkDB)
			}
		}
		st := e.st
		st.mu.Lock()
		if st.gen == gen && e.r.liveCount(e.id) == 0 && (!e.tracked || tracked) {
			st.upper, st.apk = upper, apk
			if tracked {
				st.tracked = true
			} else {
				st.listing = &after
			}
		}
		st.mu.Unlock()
	}
	// The run's effects, then its end: a run is recorded like a span,
	// its effects its events.
	for i := range files {
		e.r.record(ctx, e.owner, api.SandboxEvent{Time: ev.Time, SandboxID: e.id, RunID: e.run, Type: api.EventFileChanged, Actor: e.actor, File: &files[i]})
	}
	for i := range pkgs {
		e.r.record(ctx, e.owner, api.SandboxEvent{Time: ev.Time, SandboxID: e.id, RunID: e.run, Type: api.EventPackage, Actor: e.actor, Package: &pkgs[i]})
	}
	e.r.record(ctx, e.owner, ev)
}
