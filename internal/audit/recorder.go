// Package audit is the flight recorder: one event model for everything a
// sandbox did (commands with their output digest, the files and packages
// they changed, network decisions, lifecycle operations and transitions,
// limit events, the bridge's events), stored append-only per sandbox in a
// hash chain whose heads the daemon signs, queried and followed through
// the API, and verified by `agentbox audit verify`. See docs/AUDIT.md.
//
// It is a feature attached to the sandbox core (docs/EXTENSIONS.md): an
// Observer of the core's operations and transitions, an ExecWrapper that
// follows every command, and an io.Closer; the egress proxy and the
// bridge hand it their records (Egress, Bridge).
package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Config configures a Recorder.
type Config struct {
	// Store keeps the records (required); the Recorder closes it.
	Store *Store
	// Redactor returns the redactor of sandbox id's secret values (nil:
	// nothing to redact); every text recorded passes through it.
	Redactor func(id string) *redact.Redactor
	// FlushEvery is how often dropped events are reported and heads
	// signed (default 5 s); SweepEvery how often the records of deleted
	// sandboxes past their retention are removed (default 1 h).
	FlushEvery time.Duration
	SweepEvery time.Duration
	// TrackDir, when set, is a directory of the daemon's own on the
	// filesystem of the sandboxes' writable layers: the change tracker
	// (fanotify.go) follows that filesystem, so that a run's file
	// changes cost what the run changed, not the layer's size. Empty, or
	// when the kernel cannot (no fanotify filesystem marks, no
	// directory handles on that filesystem, overlayfs writes not seen:
	// logged at start), every run walks its layer.
	TrackDir string
	// TrackFrom is the size (entries) from which a layer is followed by
	// the change tracker rather than walked (0: every layer is tracked).
	// A layer whose last run was tracked stays tracked until something
	// outside runs changes it.
	TrackFrom int
	// Sinks receive every event recorded (an exporter: OpenTelemetry,
	// internal/auditotel).
	Sinks  []Sink
	Logger *slog.Logger
}

// Sink receives every event once it is stored, redacted, with its
// sequence number. Events of one sandbox arrive in their order except
// that events recorded by different goroutines at once (a run's effects,
// an egress decision) may interleave. Event must return quickly.
type Sink interface {
	Event(ev api.SandboxEvent)
}

// Bounds of what one event records.
const (
	maxExcerpt = 2 << 10 // bytes of a run's output kept
	maxCommand = 4 << 10
	maxText    = 1 << 10 // detail, error
)

// Recorder is the extension. Its methods are safe for concurrent use.
type Recorder struct {
	cfg   Config
	store *Store
	log   *slog.Logger
	scan  scanLimits
	core  sandbox.Core // set by Provision, before any hook runs
	trk   *trackers    // nil: every run walks

	stop chan struct{}
	done chan struct{}
	// wg counts the goroutines recording runs' effects (exec.go).
	wg sync.WaitGroup

	// mu guards live and fs.
	mu sync.Mutex
	// live are the foreground runs in progress, by sandbox id, then run
	// id, with their process's pid once started (egress attribution:
	// LiveRun).
	live map[string]map[string]*liveRun
	// fs is each sandbox's writable layer between runs (exec.go).
	fs map[string]*fsState
}

var (
	_ sandbox.Extension   = (*Recorder)(nil)
	_ sandbox.Provisioner = (*Recorder)(nil)
	_ sandbox.Observer    = (*Recorder)(nil)
	_ sandbox.ExecWrapper = (*Recorder)(nil)
)

// New returns a Recorder and starts its timers (stopped by Close).
func New(cfg Config) *Recorder {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 5 * time.Second
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Hour
	}
	r := &Recorder{cfg: cfg, store: cfg.Store, log: cfg.Logger, scan: defaultScanLimits,
		stop: make(chan struct{}), done: make(chan struct{}), live: map[string]map[string]*liveRun{}, fs: map[string]*fsState{}}
	r.scan.TrackFrom = max(cfg.TrackFrom, 0)
	if cfg.TrackDir != "" {
		trk, err := newTrackers(cfg.TrackDir, r.scan.Tracked, r.log)
		if err != nil {
			r.log.Info("audit: no change tracker; every run walks its writable layer", "err", err)
		} else {
			r.trk = trk
		}
	}
	go r.loop()
	return r
}

// Name implements sandbox.Extension.
func (r *Recorder) Name() string { return "audit" }

// Provision implements sandbox.Provisioner.
func (r *Recorder) Provision(c sandbox.Core) error {
	r.core = c
	return nil
}

// Close stops the timers, signs every open record's head and closes the
// store.
func (r *Recorder) Close() error {
	select {
	case <-r.stop:
		return nil
	default:
	}
	close(r.stop)
	<-r.done
	r.wg.Wait()
	if r.trk != nil {
		r.trk.close()
	}
	err := r.store.Close()
	for _, s := range r.cfg.Sinks {
		if c, ok := s.(interface{ Close(context.Context) error }); ok {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = errors.Join(err, c.Close(ctx))
			cancel()
		}
	}
	return err
}

func (r *Recorder) loop() {
	defer close(r.done)
	flush := time.NewTicker(r.cfg.FlushEvery)
	defer flush.Stop()
	sweep := time.NewTicker(r.cfg.SweepEvery)
	defer sweep.Stop()
	r.sweep()
	for {
		select {
		case <-r.stop:
			return
		case <-flush.C:
			if err := r.store.Flush(); err != nil {
				r.log.Warn("audit: flushing records", "err", err)
			}
		case <-sweep.C:
			r.sweep()
		}
	}
}

func (r *Recorder) sweep() {
	n, err := r.store.Sweep(time.Now())
	if err != nil {
		r.log.Warn("audit: removing expired records", "err", err)
	}
	if n > 0 {
		r.log.Info("audit: removed records of deleted sandboxes past their retention", "records", n)
	}
}

// record appends ev to its sandbox's record, redacting its texts first.
func (r *Recorder) record(ctx context.Context, owner string, ev api.SandboxEvent) {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	ev.Tenant = tenant.Owner(owner)
	if ev.Actor == "" {
		ev.Actor = tenant.From(ctx).String()
	}
	r.redact(&ev)
	seq, err := r.store.Append(owner, ev)
	if err != nil {
		r.log.WarnContext(ctx, "audit: recording event", "sandbox", ev.SandboxID, "type", ev.Type, "err", err)
		return
	}
	if seq == 0 {
		return // dropped, counted
	}
	ev.Seq = seq
	for _, s := range r.cfg.Sinks {
		s.Event(ev)
	}
}

// redact replaces the secret values of ev's sandbox in every text of ev.
func (r *Recorder) redact(ev *api.SandboxEvent) {
	ev.Detail = clip(ev.Detail, maxText)
	ev.Error = clip(ev.Error, maxText)
	if ev.Run != nil {
		ev.Run.Command = clip(ev.Run.Command, maxCommand)
	}
	if r.cfg.Redactor == nil {
		return
	}
	red := r.cfg.Redactor(ev.SandboxID)
	if red == nil {
		return
	}
	s := red.RedactString
	ev.Message, ev.Name, ev.Detail, ev.Error, ev.Cause = s(ev.Message), s(ev.Name), s(ev.Detail), s(ev.Error), s(ev.Cause)
	if len(ev.Attrs) > 0 {
		attrs := make(map[string]string, len(ev.Attrs))
		for k, v := range ev.Attrs {
			attrs[s(k)] = s(v)
		}
		ev.Attrs = attrs
	}
	if ev.Run != nil {
		run := *ev.Run
		run.Command, run.Cwd, run.Excerpt = s(run.Command), s(run.Cwd), s(run.Excerpt)
		if len(run.Args) > 0 {
			args := make([]string, len(run.Args))
			for i, a := range run.Args {
				args[i] = s(a)
			}
			run.Args = args
		}
		ev.Run = &run
	}
	if ev.File != nil {
		f := *ev.File
		f.Path, f.Target = s(f.Path), s(f.Target)
		ev.File = &f
	}
	if ev.Egress != nil {
		e := *ev.Egress
		e.Destination, e.Path, e.Reason = s(e.Destination), s(e.Path), s(e.Reason)
		ev.Egress = &e
	}
	if ev.Transition != nil {
		t := *ev.Transition
		t.Detail = s(t.Detail)
		ev.Transition = &t
	}
}

// clip cuts s to at most n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// opTypes maps the core's operations to event types.
var opTypes = map[string]string{
	sandbox.OpCreate:           api.EventCreate,
	sandbox.OpDelete:           api.EventDelete,
	sandbox.OpCheckpoint:       api.EventCheckpoint,
	sandbox.OpDeleteCheckpoint: api.EventDeleteCheckpoint,
	sandbox.OpRestore:          api.EventRestore,
	sandbox.OpFork:             api.EventFork,
	sandbox.OpMerge:            api.EventMerge,
	sandbox.OpSaveTemplate:     api.EventSaveTemplate,
	sandbox.OpUpgrade:          api.EventUpgrade,
}

// Observe implements sandbox.Observer: transitions, the core's events
// (OOM kills), the operations on a sandbox as a whole and the guest calls
// that change something (file writes, stdin, signals) are recorded. Execs
// are recorded by WrapExec; reads are not. A pool's hidden sandbox is
// recorded from its hand-out on. Observe never blocks: an event that
// must follow a run's effects still being recorded is queued behind them.
func (r *Recorder) Observe(ctx context.Context, op sandbox.Op) {
	id := op.Sandbox
	if id == "" {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if op.Hidden {
		// A pool's housekeeping is not recorded; a discarded hidden
		// sandbox's record (its set-up's runs) is finished like any.
		if op.Kind == sandbox.OpDelete {
			r.after(id, func() { r.finish(ctx, id) })
		}
		return
	}
	ev := api.SandboxEvent{Time: op.At.UTC(), SandboxID: id, Detail: op.Detail}
	if op.Err != nil {
		ev.Error = op.Err.Error()
	}
	if op.Duration > 0 {
		ev.Attrs = map[string]string{"duration_ms": fmt.Sprintf("%.3f", float64(op.Duration.Microseconds())/1000)}
	}
	switch op.Kind {
	case sandbox.OpTransition:
		if op.Transition == nil {
			return
		}
		r.invalidate(id)
		t := *op.Transition
		ev.Type, ev.Transition, ev.Cause, ev.Detail = api.EventTransition, &t, t.Cause, ""
		if !t.At.IsZero() {
			ev.Time = t.At.UTC()
		}
	case sandbox.OpEvent:
		if op.Event == nil {
			return
		}
		ev = *op.Event
		ev.Seq = 0
	case sandbox.OpGuestCall:
		if readOnlyGuestCall(op.Detail) {
			return
		}
		r.invalidate(id)
		ev.Type = api.EventGuestCall
	case sandbox.OpStartProcess, sandbox.OpExec, sandbox.OpAttach:
		return // WrapExec's
	default:
		t, ok := opTypes[op.Kind]
		if !ok {
			return
		}
		r.invalidate(id)
		ev.Type = t
	}
	r.after(id, func() {
		r.record(ctx, op.Tenant, ev)
		if op.Kind == sandbox.OpDelete {
			r.finish(ctx, id)
		}
	})
}

// finish ends deleted sandbox id's record: the delete was its last event;
// it is kept for the retention period.
func (r *Recorder) finish(ctx context.Context, id string) {
	if err := r.store.Finish(id); err != nil {
		r.log.WarnContext(ctx, "audit: finishing the record of a deleted sandbox", "sandbox", id, "err", err)
	}
	r.mu.Lock()
	st := r.fs[id]
	delete(r.fs, id)
	delete(r.live, id)
	r.mu.Unlock()
	if st != nil && r.trk != nil {
		st.mu.Lock()
		upper := st.tracking
		st.mu.Unlock()
		if upper != "" {
			r.trk.forget(upper)
		}
	}
}

// after runs fn, which records events of sandbox id, once the effects of
// its ended runs are recorded: at once when none is pending, else on a
// goroutine queued behind them.
func (r *Recorder) after(id string, fn func()) {
	st := r.fsOf(id)
	st.mu.Lock()
	prev := st.pending
	if prev == nil || closed(prev) {
		st.mu.Unlock()
		fn()
		return
	}
	done := make(chan struct{})
	st.pending = done
	st.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		<-prev
		fn()
	}()
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Egress records a decision of the egress proxy (egress.Config.OnRecord),
// with the run the proxy attributed its connection to (the daemon's
// egress.Config.RunOf: runsecrets.ActiveRun, then LiveRun).
func (r *Recorder) Egress(rec api.EgressRecord) {
	ev := api.SandboxEvent{Time: rec.Time.UTC(), SandboxID: rec.SandboxID, RunID: rec.RunID, Type: api.EventNetwork, Egress: &rec}
	r.after(rec.SandboxID, func() { r.recordFor(context.Background(), ev) })
}

// Bridge records an event a program sent through the API bridge
// (sandboxevents.Config.OnRecord), already redacted and verified.
func (r *Recorder) Bridge(ev api.SandboxEvent) {
	ev.Seq = 0
	r.after(ev.SandboxID, func() { r.recordFor(context.Background(), ev) })
}

// recordFor records ev, looking its sandbox's owner up.
func (r *Recorder) recordFor(ctx context.Context, ev api.SandboxEvent) {
	if r.core == nil {
		return
	}
	h, err := r.core.Handle(tenant.WithPrincipal(ctx, tenant.Admin), ev.SandboxID)
	if err != nil {
		return // gone: its record is finished
	}
	ev.Actor = "sandbox"
	r.record(ctx, h.Owner(), ev)
}

// LiveRun returns the id of the run a new egress connection of sandbox id
// is attributed to, or "": the rule of runsecrets.ActiveRun for runs
// without a token. The sandbox has exactly one foreground run in progress
// and the guest reports its process as the only one running (a
// background process beside it makes the connection unattributable). It
// costs a guest round trip only when exactly one run is in progress.
// Like ActiveRun's, the label is bookkeeping, never an input to a
// decision.
func (r *Recorder) LiveRun(ctx context.Context, id string) string {
	r.mu.Lock()
	runs := r.live[id]
	var run string
	var lr *liveRun
	for k, v := range runs {
		run, lr = k, v
	}
	n := len(runs)
	r.mu.Unlock()
	if n != 1 || r.core == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, liveRunTimeout)
	defer cancel()
	// The process may connect before the exec call returned its pid.
	select {
	case <-lr.started:
	case <-ctx.Done():
		return ""
	}
	r.mu.Lock()
	pid := lr.pid
	r.mu.Unlock()
	if !sandboxfiles.New(r.core).SoleProcess(ctx, id, pid) {
		return ""
	}
	return run
}

// liveRun is a foreground run in progress.
type liveRun struct {
	pid     int           // its process, once started; guarded by Recorder.mu
	started chan struct{} // closed when pid is set
}

// liveRunTimeout bounds LiveRun's guest round trip.
const liveRunTimeout = 2 * time.Second

// liveCount is the number of sandbox id's foreground runs in progress.
func (r *Recorder) liveCount(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live[id])
}

// setLive marks run of sandbox id in progress or, with live false,
// ended.
func (r *Recorder) setLive(id, run string, live bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if live {
		if r.live[id] == nil {
			r.live[id] = map[string]*liveRun{}
		}
		r.live[id][run] = &liveRun{started: make(chan struct{})}
		return
	}
	delete(r.live[id], run)
	if len(r.live[id]) == 0 {
		delete(r.live, id)
	}
}

// setPid records the process of run of sandbox id.
func (r *Recorder) setPid(id, run string, pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if lr := r.live[id][run]; lr != nil && lr.pid == 0 && pid > 0 {
		lr.pid = pid
		close(lr.started)
	}
}

// settle waits until what sandbox id's ended runs did is recorded, so a
// query made after a run's exit sees its effects.
func (r *Recorder) settle(ctx context.Context, id string) {
	r.mu.Lock()
	st := r.fs[id]
	r.mu.Unlock()
	if st != nil {
		st.waitPending(ctx)
	}
}

// access resolves sandbox id for the caller of ctx: a sandbox it sees
// (live), or the finished record of a deleted sandbox its tenant owned.
// Another tenant's sandbox is the same ErrNotFound as an unknown one.
func (r *Recorder) access(ctx context.Context, id string) (owner string, live bool, err error) {
	h, herr := r.core.Handle(ctx, id)
	if herr == nil {
		return h.Owner(), true, nil
	}
	if !errors.Is(herr, errdefs.ErrNotFound) {
		return "", false, herr
	}
	info, err := r.store.Info(id)
	if err != nil || !info.Deleted || !tenant.From(ctx).Sees(info.Owner) {
		return "", false, herr
	}
	return info.Owner, false, nil
}

// Events returns sandbox id's recorded events selected by q, oldest
// first. A deleted sandbox's record can be read until its retention ends.
func (r *Recorder) Events(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error) {
	if _, _, err := r.access(ctx, id); err != nil {
		return nil, err
	}
	r.settle(ctx, id)
	out := []api.SandboxEvent{}
	_, err := r.scanEvents(ctx, id, 0, q, func(ev api.SandboxEvent) error {
		out = append(out, ev)
		return nil
	})
	return out, err
}

// errLimit stops a scan at the query's limit.
var errLimit = errors.New("limit reached")

// scanEvents calls fn for the events selected by q from byte offset off
// and returns the offset after the last record read.
func (r *Recorder) scanEvents(ctx context.Context, id string, off int64, q api.EventQuery, fn func(api.SandboxEvent) error) (int64, error) {
	n := 0
	off, err := r.store.scan(id, off, func(rec record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ev, err := decodeEvent(rec)
		if err != nil {
			return err
		}
		ev.SandboxID = id
		if !q.Match(ev) {
			return nil
		}
		if err := fn(ev); err != nil {
			return err
		}
		n++
		if q.Limit > 0 && n >= q.Limit {
			return errLimit
		}
		return nil
	})
	if errors.Is(err, errLimit) {
		err = nil
	}
	return off, err
}

// Follow calls ready (when not nil) once the sandbox is found, then fn
// with sandbox id's events selected by q, the recorded ones first, then
// each as it is recorded, until ctx ends, fn fails or the sandbox is
// deleted (its delete event is the last). q.Limit bounds the recorded
// ones only.
func (r *Recorder) Follow(ctx context.Context, id string, q api.EventQuery, ready func(), fn func(api.SandboxEvent) error) error {
	owner, live, err := r.access(ctx, id)
	if err != nil {
		return err
	}
	if ready != nil {
		ready()
	}
	var changed <-chan struct{}
	finished := !live
	if live {
		// Taken before reading, so no append is missed in between.
		if changed, finished, err = r.store.changes(id, owner); err != nil {
			finished = true
		}
	}
	var last uint64
	track := func(ev api.SandboxEvent) error {
		last = ev.Seq
		return fn(ev)
	}
	off, err := r.scanEvents(ctx, id, 0, q, track)
	if err != nil {
		return err
	}
	q.Limit = 0
	if q.After < last {
		q.After = last
	}
	for !finished {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		changed, finished, err = r.store.changes(id, owner)
		if err != nil {
			finished = true
		}
		if off, err = r.scanEvents(ctx, id, off, q, track); err != nil {
			return err
		}
	}
	return nil
}

// Verify checks sandbox id's record (Store.Verify) for the caller of ctx.
func (r *Recorder) Verify(ctx context.Context, id string) (api.AuditVerifyResult, error) {
	if _, _, err := r.access(ctx, id); err != nil {
		return api.AuditVerifyResult{}, err
	}
	r.settle(ctx, id)
	return r.store.Verify(id)
}

// VerifyAll checks the record of every sandbox the caller of ctx sees,
// deleted ones in their retention included.
func (r *Recorder) VerifyAll(ctx context.Context) ([]api.AuditVerifyResult, error) {
	ids, err := r.store.IDs()
	if err != nil {
		return nil, err
	}
	p := tenant.From(ctx)
	out := []api.AuditVerifyResult{}
	for _, id := range ids {
		info, err := r.store.Info(id)
		if err != nil || !p.Sees(info.Owner) {
			continue
		}
		res, err := r.store.Verify(id)
		if err != nil {
			return nil, fmt.Errorf("verifying the record of %s: %w", id, err)
		}
		out = append(out, res)
	}
	return out, nil
}
