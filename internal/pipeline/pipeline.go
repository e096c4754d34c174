// Package pipeline is agentbox's one execution pipeline: every command run
// in a sandbox, whatever triggered it, goes through Pipeline.Execute, which
// resolves (or creates) the sandbox, starts the command, meters it and
// leaves one api.Run record of the same shape for every trigger.
//
// The triggers are routes to Execute and nothing more:
//
//   - API, CLI and SDK exec: the daemon's HTTP service adapter calls
//     Execute with TriggerAPI and the caller identity of the request.
//   - Schedules (Scheduler): a cron slot calls Execute with
//     TriggerSchedule and a RunAction.
//   - Webhooks (Hooks): a signed request calls Execute with TriggerWebhook,
//     the same RunAction shape and the request body as stdin.
//
// Adding a trigger is writing another such caller; metering, records and
// policy stay here.
package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/outputschema"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Labels of the sandboxes created for one run (and deleted after it).
const (
	LabelRun     = "agentbox.run"
	LabelTrigger = "agentbox.trigger"
)

// DefaultTenant owns runs of no other tenant.
const DefaultTenant = sandbox.DefaultTenant

// Defaults of Config.
const (
	DefaultSampleInterval = time.Second
	DefaultKeepRuns       = 100_000
	// MaxOutput bounds the output tail kept in the record of an unwatched
	// run.
	MaxOutput = 8 << 10
)

// Sandboxes is what the pipeline needs of the sandbox manager (the
// daemon adapts *sandbox.Manager to it). The contract of each method is
// the Manager's of that name; LookupSandbox is sandbox.Handle.Sandbox,
// WatchProcess sandbox.Handle.Watch and SandboxStats sandbox.Handle.Stats
// of the sandbox as the caller of ctx sees it.
type Sandboxes interface {
	CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	LookupSandbox(ctx context.Context, id string) (api.Sandbox, error)
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error)
	StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error)
	WatchProcess(ctx context.Context, id string, pid int) (execstream.Stream, error)
	SandboxStats(ctx context.Context, id string) (runtime.Stats, error)
}

// EgressLogger is implemented by Sandboxes whose egress proxy records
// connections; runs are then charged their egress bytes.
type EgressLogger interface {
	EgressLog(ctx context.Context, id string, limit int) ([]api.EgressRecord, error)
}

// Config configures a Pipeline.
type Config struct {
	Sandboxes Sandboxes
	Store     store.PipelineStore
	// Clock stamps records and drives usage sampling and schedules; nil is
	// the real clock.
	Clock  clock.Clock
	Logger *slog.Logger
	// SampleInterval is how often a running command's sandbox counters are
	// sampled for the memory integral (default DefaultSampleInterval).
	SampleInterval time.Duration
	// KeepRuns is how many run records are kept (default DefaultKeepRuns).
	KeepRuns int
	// JournalPath is the run journal (journal.go): every run is written
	// to it as started before its command starts, so that a daemon
	// killed during the run leaves it for the next one to reconcile
	// (Recover). "" keeps no journal: runs in flight when the daemon
	// stops have no record.
	JournalPath string
}

// Pipeline executes runs and keeps their records. Safe for concurrent use.
type Pipeline struct {
	cfg Config
	sbx Sandboxes
	st  store.PipelineStore
	clk clock.Clock
	log *slog.Logger
	// writing counts finished records being written in the background.
	writing sync.WaitGroup
	// runs writes finished records in batches.
	runs *runBatcher
	// journal records runs as started before their command starts (nil:
	// none); recovered are the runs a previous daemon left open in it,
	// until Recover.
	journal   *journal
	recovered []openRun

	// mu guards the fields below.
	mu sync.Mutex
	// pending are records not yet durable: running, or finished and being
	// written. Reads merge them over the store.
	pending map[string]*api.Run
	// writes counts stored records since the last prune.
	writes int
	// lastID is the time part of the newest run id.
	lastID int64
}

// New returns a Pipeline.
func New(cfg Config) (*Pipeline, error) {
	if cfg.Sandboxes == nil || cfg.Store == nil {
		return nil, fmt.Errorf("pipeline: sandboxes and store are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = DefaultSampleInterval
	}
	if cfg.KeepRuns <= 0 {
		cfg.KeepRuns = DefaultKeepRuns
	}
	p := &Pipeline{
		cfg: cfg, sbx: cfg.Sandboxes, st: cfg.Store, clk: cfg.Clock, log: cfg.Logger,
		runs:    &runBatcher{st: cfg.Store, delay: runBatchDelay},
		pending: map[string]*api.Run{},
	}
	if cfg.JournalPath != "" {
		j, open, err := openJournal(cfg.JournalPath)
		if err != nil {
			return nil, err
		}
		p.journal, p.recovered = j, open
	}
	return p, nil
}

// Run is one request to execute a command.
type Run struct {
	// Trigger is api.TriggerAPI, api.TriggerSchedule, api.TriggerWebhook or
	// api.TriggerMCP.
	Trigger string
	// Who is the identity behind the trigger ("unix-socket", "api-key:…",
	// "schedule:<id>", "hook:<id>").
	Who string
	// Tenant is the tenant the run acts as (schedules and hooks: their
	// owner); "" is the caller of ctx. The run's record belongs to the
	// tenant owning its sandbox, which pays for it.
	Tenant string
	// SandboxID names an existing sandbox; otherwise Create says which to
	// create: with a Name, the sandbox of that name is reused (created on
	// first use) and kept; without one, a fresh sandbox is created for the
	// run and deleted after it.
	SandboxID string
	Create    *api.CreateSandboxRequest
	// Exec is the command. Background runs return at once with the
	// process; the record is finished when the process exits.
	Exec api.ExecRequest
	// KeepOutput keeps the tail of the output in the record (runs nobody
	// watches: schedules, webhooks).
	KeepOutput bool
}

// Execution is a started run.
type Execution struct {
	// ID is the run's id (its record: Pipeline.Get).
	ID      string
	Sandbox string
	// Stream is the event stream of a foreground run; the caller reads it
	// and closes it. Closing before the exit detaches: the record is then
	// finished when the process exits.
	Stream execstream.Stream
	// Process is the started process of a background run.
	Process api.Process
}

// newRunID returns an id that sorts by start time, and by order of
// creation among runs of the same nanosecond (the store lists runs newest
// first by key).
func (p *Pipeline) newRunID(t time.Time) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	p.mu.Lock()
	n := max(t.UnixNano(), p.lastID+1)
	p.lastID = n
	p.mu.Unlock()
	return fmt.Sprintf("run_%016x%s", n, hex.EncodeToString(b[:]))
}

// Execute starts r: it resolves or creates the sandbox, starts the command
// and returns the started Execution, whose record is running (visible to
// Get and List at once) and is finished and stored when the command ends.
// Execute is the only way commands are started by the daemon's triggers.
// On error the run is recorded as failed (when it got as far as having a
// record) and a sandbox created for it is deleted.
func (p *Pipeline) Execute(ctx context.Context, r Run) (*Execution, error) {
	if r.Tenant != "" {
		ctx = tenant.WithPrincipal(ctx, tenant.Principal{Tenant: r.Tenant, Scope: api.ScopeFull})
	}
	now := p.clk.Now().UTC()
	rec := &api.Run{
		ID:        p.newRunID(now),
		Trigger:   r.Trigger,
		Who:       r.Who,
		Tenant:    tenant.From(ctx).Tenant,
		Cmd:       slices.Clone(r.Exec.Cmd),
		Command:   r.Exec.Command,
		State:     api.RunRunning,
		StartedAt: now,
	}
	if rec.Tenant == "" {
		rec.Tenant = DefaultTenant
	}
	if rec.Trigger == "" {
		return nil, fmt.Errorf("run: no trigger: %w", errdefs.ErrInvalidArgument)
	}
	var schema *outputschema.Schema
	if len(r.Exec.OutputSchema) > 0 {
		if r.Exec.Background || r.Exec.TTY != nil {
			return nil, fmt.Errorf("output_schema is not allowed with background or tty: %w", errdefs.ErrInvalidArgument)
		}
		var err error
		if schema, err = outputschema.Compile(r.Exec.OutputSchema); err != nil {
			return nil, err
		}
	}
	rs := &runState{p: p, rec: rec, keepOutput: r.KeepOutput, done: make(chan struct{})}
	sbID, ephemeral, err := p.resolve(ctx, r, rec)
	if err != nil {
		return nil, err
	}
	rs.ephemeral = ephemeral
	req := r.Exec
	req.OutputSchema = nil // the boundary's, below; the sandbox never sees it
	req.Env = mapsClone(req.Env)
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	req.Env[api.RunIDEnv] = rec.ID
	// Counters are sampled before the start when the sandbox is awake;
	// a sleeping one is woken by the exec and sampled right after it.
	statsAt, stats := p.clk.Now(), p.stats(ctx, sbID)
	rs.meter.sample(statsAt, stats)
	p.track(rec)
	// Journaled before the command starts: a daemon killed from here on
	// leaves the run for the next one to reconcile. Without the journal
	// entry the run is not started: it would go unrecorded.
	if err := p.journal.started(cloneRun(rec), ephemeral, r.KeepOutput, stats, statsAt); err != nil {
		err = fmt.Errorf("run %s: %w: %w", rec.ID, err, errdefs.ErrUnavailable)
		rs.fail(err)
		return nil, err
	}
	exe := &Execution{ID: rec.ID, Sandbox: sbID}
	ctx = sandbox.WithRunID(ctx, rec.ID)
	if req.Background {
		proc, err := p.sbx.StartProcess(ctx, sbID, req)
		if err != nil {
			rs.fail(err)
			return nil, err
		}
		rs.notePid(proc.Pid)
		rs.started(ctx, sbID)
		exe.Process = proc
		go rs.follow(sbID, proc.Pid)
		return exe, nil
	}
	s, err := p.sbx.Exec(ctx, sbID, req)
	if err != nil {
		rs.fail(err)
		return nil, err
	}
	rs.started(ctx, sbID)
	exe.Stream = &recStream{inner: s, rs: rs}
	if schema != nil {
		exe.Stream = outputschema.Wrap(exe.Stream, schema)
	}
	return exe, nil
}

// resolve finds or creates the run's sandbox and notes it in rec.
func (p *Pipeline) resolve(ctx context.Context, r Run, rec *api.Run) (id string, ephemeral bool, err error) {
	if r.SandboxID != "" {
		rec.Sandbox = r.SandboxID
		sb, err := p.sbx.LookupSandbox(ctx, r.SandboxID)
		if err != nil {
			return "", false, err
		}
		rec.Template, rec.Tenant = sb.Template, tenant.Owner(sb.Tenant)
		return sb.ID, false, nil
	}
	if r.Create == nil {
		return "", false, fmt.Errorf("run: no sandbox: %w", errdefs.ErrInvalidArgument)
	}
	req := *r.Create
	req.Labels = mapsClone(req.Labels)
	if req.Name == "" {
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[LabelRun] = rec.ID
		req.Labels[LabelTrigger] = rec.Trigger
	}
	sb, err := p.sbx.CreateSandbox(ctx, req)
	if err != nil {
		p.failRecord(rec, fmt.Errorf("creating the run's sandbox: %w", err))
		return "", false, err
	}
	rec.Sandbox, rec.Template, rec.Tenant = sb.ID, sb.Template, tenant.Owner(sb.Tenant)
	return sb.ID, req.Name == "", nil
}

// ReapOrphans deletes the sandboxes created for single runs (LabelRun)
// that no run of this pipeline owns: a daemon that stopped during such a
// run left its sandbox behind. Call it at start-up, before any trigger.
func (p *Pipeline) ReapOrphans(ctx context.Context) {
	sbs, err := p.sbx.ListSandboxes(ctx, nil)
	if err != nil {
		p.log.WarnContext(ctx, "listing sandboxes for orphaned run sandboxes", "err", err)
		return
	}
	for _, sb := range sbs {
		run, ok := sb.Labels[LabelRun]
		if !ok {
			continue
		}
		p.mu.Lock()
		_, live := p.pending[run]
		p.mu.Unlock()
		if live {
			continue
		}
		if err := p.sbx.DeleteSandbox(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			p.log.WarnContext(ctx, "deleting an orphaned run sandbox", "sandbox", sb.ID, "run", run, "err", err)
			continue
		}
		p.log.InfoContext(ctx, "deleted the sandbox of a run the daemon did not see end", "sandbox", sb.ID, "run", run)
	}
}

// stats samples the sandbox's counters; ok is false when there is none.
func (p *Pipeline) stats(ctx context.Context, id string) *runtime.Stats {
	st, err := p.sbx.SandboxStats(ctx, id)
	if err != nil {
		return nil
	}
	return &st
}

// track makes rec visible to readers before it is durable.
func (p *Pipeline) track(rec *api.Run) {
	p.mu.Lock()
	p.pending[rec.ID] = rec
	p.mu.Unlock()
}

// failRecord stores rec as a run that failed before its command started.
func (p *Pipeline) failRecord(rec *api.Run, err error) {
	p.mu.Lock()
	rec.State = api.RunFailed
	rec.Error = clientText(err)
	end := p.clk.Now().UTC()
	rec.EndedAt = &end
	p.pending[rec.ID] = rec
	p.mu.Unlock()
	p.persist(rec.ID)
}

// persist writes the finished record id (in a batch: it returns within
// runBatchDelay and a commit) and drops it from pending.
func (p *Pipeline) persist(id string) {
	p.mu.Lock()
	rec, ok := p.pending[id]
	var snap api.Run
	if ok {
		snap = cloneRun(rec)
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	ctx := context.Background()
	if err := p.runs.put(snap); err != nil {
		p.log.Error("storing run record", "run", id, "err", err)
		return // kept in memory: readers still see it
	}
	if err := p.journal.ended(id); err != nil {
		p.log.Warn("journaling the end of a run", "run", id, "err", err)
	}
	p.mu.Lock()
	delete(p.pending, id)
	p.writes++
	prune := p.writes >= 1000
	if prune {
		p.writes = 0
	}
	p.mu.Unlock()
	if prune {
		if err := p.st.PruneRuns(ctx, p.cfg.KeepRuns); err != nil {
			p.log.Warn("pruning run records", "err", err)
		}
	}
}

// Flush waits until every finished record handed to the background writer
// is on disk (or failed to be written and stays in memory).
func (p *Pipeline) Flush() { p.writing.Wait() }

// Close flushes the finished records and closes the run journal; runs
// still under way stay open in it for the next daemon (Recover). The
// daemon calls it when it shuts down.
func (p *Pipeline) Close() error {
	p.Flush()
	return p.journal.close()
}

// ForgetTenant deletes the run records of tenant (tenant deletion): the
// stored ones and the finished ones not yet written. The caller makes
// sure the tenant has no run under way (it owns no sandbox).
func (p *Pipeline) ForgetTenant(ctx context.Context, tenant string) error {
	p.Flush()
	p.mu.Lock()
	for id, r := range p.pending {
		if r.Tenant == tenant && r.State != api.RunRunning {
			delete(p.pending, id)
		}
	}
	p.mu.Unlock()
	n, err := p.st.DeleteRuns(ctx, store.RunFilter{Tenant: tenant})
	if err != nil {
		return err
	}
	p.log.InfoContext(ctx, "run records of a deleted tenant deleted", "tenant", tenant, "runs", n)
	return nil
}

// Get returns the record of run id.
func (p *Pipeline) Get(ctx context.Context, id string) (api.Run, error) {
	p.mu.Lock()
	rec, ok := p.pending[id]
	var snap api.Run
	if ok {
		snap = cloneRun(rec)
	}
	p.mu.Unlock()
	if !ok {
		var err error
		if snap, err = p.st.GetRun(ctx, id); err != nil {
			return api.Run{}, err
		}
	}
	// Another tenant's run is not found, like an unknown id.
	if !tenant.From(ctx).Sees(snap.Tenant) {
		return api.Run{}, fmt.Errorf("run %s: %w", id, errdefs.ErrNotFound)
	}
	return snap, nil
}

// List returns the records matching f, newest first, running ones
// included.
func (p *Pipeline) List(ctx context.Context, f store.RunFilter) ([]api.Run, error) {
	if pr := tenant.From(ctx); !pr.IsAdmin() {
		f.Tenant = pr.Tenant
	}
	p.mu.Lock()
	var live []api.Run
	for _, rec := range p.pending {
		if f.Match(*rec) {
			live = append(live, cloneRun(rec))
		}
	}
	p.mu.Unlock()
	stored, err := p.st.ListRuns(ctx, f)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(live))
	for _, r := range live {
		seen[r.ID] = true
	}
	out := live
	for _, r := range stored {
		if !seen[r.ID] {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b api.Run) int { return strings.Compare(b.ID, a.ID) })
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Wait reads exe's stream to its end and returns the finished record. It
// closes the stream.
func (p *Pipeline) Wait(ctx context.Context, exe *Execution) (api.Run, error) {
	if exe.Stream == nil {
		return api.Run{}, fmt.Errorf("run %s is a background run: %w", exe.ID, errdefs.ErrInvalidArgument)
	}
	stop := context.AfterFunc(ctx, func() { _ = exe.Stream.Close() })
	for {
		if _, err := exe.Stream.Next(); err != nil {
			break
		}
	}
	stop()
	_ = exe.Stream.Close()
	if rs, ok := exe.Stream.(*recStream); ok {
		// A stream cut short is finished by its follower when the process
		// exits.
		select {
		case <-rs.rs.done:
		case <-ctx.Done():
			return api.Run{}, fmt.Errorf("waiting for run %s: %w", exe.ID, ctx.Err())
		}
	}
	return p.Get(context.WithoutCancel(ctx), exe.ID)
}

// runState is the bookkeeping of one run between its start and its end.
type runState struct {
	p          *Pipeline
	rec        *api.Run // guarded by p.mu once tracked
	ephemeral  bool
	keepOutput bool
	meter      meter
	sampler    clock.Timer

	// done is closed when the record is finished.
	done chan struct{}
	once sync.Once
	// pidOnce journals the run's process once.
	pidOnce sync.Once

	// mu guards meter (once started), output, finished and sampler.
	mu       sync.Mutex
	output   []byte
	finished bool
}

// started samples the counters (if the sandbox slept before the exec)
// and starts periodic sampling.
func (rs *runState) started(ctx context.Context, sbID string) {
	if !rs.meter.sampled() {
		rs.meter.sample(rs.p.clk.Now(), rs.p.stats(ctx, sbID))
	}
	rs.armSampler(sbID)
}

func (rs *runState) armSampler(sbID string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.finished {
		return
	}
	rs.sampler = rs.p.clk.AfterFunc(rs.p.cfg.SampleInterval, func() {
		rs.mu.Lock()
		finished := rs.finished
		rs.mu.Unlock()
		if finished {
			return
		}
		st := rs.p.stats(context.Background(), sbID)
		rs.mu.Lock()
		if !rs.finished {
			rs.meter.sample(rs.p.clk.Now(), st)
		}
		rs.mu.Unlock()
		rs.armSampler(sbID)
	})
}

// fail records a run whose command did not start.
func (rs *runState) fail(err error) {
	rs.finish(nil, err)
}

// addOutput keeps the tail of the output.
func (rs *runState) addOutput(data []byte) {
	if !rs.keepOutput {
		return
	}
	rs.mu.Lock()
	rs.output = append(rs.output, data...)
	if n := len(rs.output); n > MaxOutput {
		rs.output = append(rs.output[:0], rs.output[n-MaxOutput:]...)
	}
	rs.mu.Unlock()
}

// finish completes the record with the exit event (or the error that
// ended the run), then, in the background, stores it and deletes an
// ephemeral sandbox; done closes after that. Only the first call counts.
func (rs *runState) finish(exit *api.ExecEvent, cause error) {
	rs.once.Do(func() {
		p := rs.p
		end := p.clk.Now()
		p.mu.Lock()
		sbID := rs.rec.Sandbox
		p.mu.Unlock()
		st := p.stats(context.Background(), sbID)
		rs.mu.Lock()
		rs.finished = true
		if rs.sampler != nil {
			rs.sampler.Stop()
		}
		rs.meter.sample(end, st)
		usage := rs.meter.usage()
		output := slices.Clone(rs.output)
		rs.mu.Unlock()

		p.mu.Lock()
		rec := rs.rec
		p.mu.Unlock()
		egress := p.egressBytes(sbID, rec.ID, rec.StartedAt, end)

		p.mu.Lock()
		endUTC := end.UTC()
		rec.EndedAt = &endUTC
		rec.DurationSeconds = end.Sub(rec.StartedAt).Seconds()
		rec.Usage = usage
		rec.Usage.EgressBytes = egress
		rec.Output = output
		switch {
		case exit != nil && exit.Type == api.EventExit:
			rec.State = api.RunFinished
			rec.ExitCode, rec.Signal, rec.TimedOut = exit.ExitCode, exit.Signal, exit.TimedOut
		case exit != nil && exit.Error != nil:
			rec.State, rec.Error = api.RunFailed, exit.Error.Message
		case errors.As(cause, new(lostError)):
			rec.State, rec.Error = api.RunLost, cause.Error()
		default:
			rec.State = api.RunFailed
			rec.Error = clientText(cause)
		}
		p.pending[rec.ID] = rec
		p.mu.Unlock()
		// The finished record is visible to readers from here on (pending);
		// writing it to disk (a synced commit shared with the records that
		// finish within runBatchDelay) and deleting a run's own sandbox
		// happen off the exit event's path, so they add nothing to an exec
		// round trip. A daemon killed in between loses that record (see
		// ReapOrphans for its sandbox).
		p.writing.Add(1)
		go func() {
			defer p.writing.Done()
			p.persist(rec.ID)
			if rs.ephemeral {
				if err := p.sbx.DeleteSandbox(context.Background(), sbID); err != nil && !errdefs.IsNotFound(err) {
					p.log.Warn("deleting a run's sandbox", "run", rec.ID, "sandbox", sbID, "err", err)
				}
			}
			close(rs.done)
		}()
	})
}

// follow finishes the run when process pid exits, for background runs and
// for foreground runs whose caller detached.
func (rs *runState) follow(sbID string, pid int) {
	if pid <= 0 {
		rs.finish(nil, errors.New("the run's process is unknown"))
		return
	}
	s, err := rs.p.sbx.WatchProcess(context.Background(), sbID, pid)
	if err != nil {
		rs.finish(nil, fmt.Errorf("the end of the run was not seen: %w", err))
		return
	}
	rs.followStream(s)
}

// followStream finishes the run with the exit event of s, the watch of
// its process, and closes s.
func (rs *runState) followStream(s execstream.Stream) {
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			rs.finish(nil, fmt.Errorf("the end of the run was not seen: %w", err))
			return
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			rs.addOutput(ev.Data)
		case api.EventExit, api.EventError:
			rs.finish(&ev, nil)
			return
		}
	}
}

// egressBytes sums the bytes of the run's egress connections: those the
// proxy tagged with the run's id or, for untagged records, the sandbox's
// connections during the run.
func (p *Pipeline) egressBytes(sbID, runID string, from, to time.Time) int64 {
	el, ok := p.sbx.(EgressLogger)
	if !ok || sbID == "" {
		return 0
	}
	recs, err := el.EgressLog(context.Background(), sbID, 0)
	if err != nil {
		return 0
	}
	var n int64
	for _, r := range recs {
		if r.RunID == runID || (r.RunID == "" && !r.Time.Before(from) && !r.Time.After(to)) {
			n += r.BytesUp + r.BytesDown
		}
	}
	return n
}

// clientText is the part of an error fit for a record: 4xx-category text
// as is; anything else only its category.
func clientText(err error) string {
	if err == nil {
		return "unknown error"
	}
	for _, e := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrConflict,
		errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrAlreadyExists,
		errdefs.ErrTooLarge, errdefs.ErrPermissionDenied} {
		if errors.Is(err, e) {
			return err.Error()
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, errdefs.ErrUnavailable) {
		return "the sandbox went away during the run"
	}
	return "internal error"
}

func cloneRun(r *api.Run) api.Run {
	c := *r
	c.Cmd = slices.Clone(r.Cmd)
	c.Output = slices.Clone(r.Output)
	if r.ExitCode != nil {
		v := *r.ExitCode
		c.ExitCode = &v
	}
	if r.EndedAt != nil {
		v := *r.EndedAt
		c.EndedAt = &v
	}
	return c
}

func mapsClone(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
