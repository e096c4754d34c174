package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // schedules name IANA zones; hosts may lack /usr/share/zoneinfo

	"github.com/robfig/cron/v3"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// cronParser accepts standard 5-field expressions and descriptors
// (@daily, @every 1h).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Scheduler fires schedules: at each cron slot (in the schedule's time
// zone) it runs the schedule's action through the pipeline with
// TriggerSchedule. Slots that passed while the daemon was down are handled
// at Start by the schedule's missed-run policy. Schedules are persisted;
// each one's last handled slot is stored before its run starts, so a
// crash never runs a slot twice.
//
// Safe for concurrent use. Timers come from the pipeline's Clock.
type Scheduler struct {
	p   *Pipeline
	st  store.PipelineStore
	clk clock.Clock
	log *slog.Logger

	// mu guards the fields below.
	mu      sync.Mutex
	entries map[string]*schedEntry
	closed  bool
	// runs counts firings whose runs are under way.
	runs sync.WaitGroup
}

type schedEntry struct {
	s     api.Schedule
	sched cron.Schedule
	timer clock.Timer
	next  time.Time
}

// NewScheduler returns a Scheduler for p's store and clock. Call Start.
func NewScheduler(p *Pipeline) *Scheduler {
	return &Scheduler{p: p, st: p.st, clk: p.clk, log: p.log, entries: map[string]*schedEntry{}}
}

// parseSchedule parses spec in zone tz ("" is UTC).
func parseSchedule(spec, tz string) (cron.Schedule, *time.Location, error) {
	if strings.Contains(spec, "TZ=") {
		return nil, nil, fmt.Errorf("cron %q: give the time zone in timezone, not in the expression: %w", spec, errdefs.ErrInvalidArgument)
	}
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil || tz == "Local" {
			return nil, nil, fmt.Errorf("unknown time zone %q: %w", tz, errdefs.ErrInvalidArgument)
		}
		loc = l
	}
	sched, err := cronParser.Parse(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("cron %q: %v: %w", spec, err, errdefs.ErrInvalidArgument)
	}
	if ss, ok := sched.(*cron.SpecSchedule); ok {
		ss.Location = loc
	}
	return sched, loc, nil
}

// nextSlot is the first slot of sched strictly after t (zero: never).
func nextSlot(sched cron.Schedule, t time.Time) time.Time { return sched.Next(t) }

// Start loads the stored schedules, applies each one's missed-run policy
// to the slots that passed while no daemon was running, and arms timers.
func (s *Scheduler) Start(ctx context.Context) error {
	list, err := s.st.ListSchedules(ctx)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	for _, sc := range list {
		sched, _, err := parseSchedule(sc.Cron, sc.Timezone)
		if err != nil {
			s.log.ErrorContext(ctx, "skipping a schedule that no longer parses", "schedule", sc.ID, "err", err)
			continue
		}
		ref := sc.CreatedAt
		if sc.LastSlotAt != nil {
			ref = *sc.LastSlotAt
		}
		e := &schedEntry{s: sc, sched: sched}
		missed := nextSlot(sched, ref)
		runMissed := false
		if !missed.IsZero() && !missed.After(now) {
			slot := now.UTC()
			e.s.LastSlotAt = &slot
			runMissed = sc.MissedRunPolicy == api.MissedRunRunOnce
			s.log.InfoContext(ctx, "schedule missed slots while the daemon was down", "schedule", sc.ID, "first_missed", missed, "policy", sc.MissedRunPolicy)
		}
		s.mu.Lock()
		s.entries[sc.ID] = e
		s.armLocked(e, now)
		s.mu.Unlock()
		if err := s.save(ctx, e); err != nil {
			return err
		}
		if runMissed {
			s.launch(e.s, "missed slot")
		}
	}
	return nil
}

// Close stops the timers. Runs under way go on in their sandboxes; their
// records are finished if the pipeline still sees them end.
func (s *Scheduler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, e := range s.entries {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
}

// armLocked sets e's timer for its first slot after after.
func (s *Scheduler) armLocked(e *schedEntry, after time.Time) {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	e.next = nextSlot(e.sched, after)
	if e.next.IsZero() || s.closed {
		e.s.NextRunAt = nil
		return
	}
	n := e.next.UTC()
	e.s.NextRunAt = &n
	slot, id := e.next, e.s.ID
	e.timer = s.clk.AfterFunc(e.next.Sub(s.clk.Now()), func() { s.fire(id, slot) })
}

// fire handles slot of schedule id: it records the slot as handled,
// arms the next one (a timer that fired late skips the slots it slept
// through, like a restart with policy skip would) and runs the action.
func (s *Scheduler) fire(id string, slot time.Time) {
	s.mu.Lock()
	e, ok := s.entries[id]
	if !ok || s.closed || !e.next.Equal(slot) {
		s.mu.Unlock()
		return // deleted, closed, or a stale timer
	}
	handled := slot.UTC()
	e.s.LastSlotAt = &handled
	now := s.clk.Now()
	after := slot
	if now.After(after) {
		after = now
	}
	s.armLocked(e, after)
	sc := e.s
	s.mu.Unlock()
	if err := s.st.PutSchedule(context.Background(), sc); err != nil {
		s.log.Error("storing a schedule's slot; not running it", "schedule", id, "slot", slot, "err", err)
		return
	}
	s.launch(sc, "cron slot")
}

// launch runs sc's action in the background.
func (s *Scheduler) launch(sc api.Schedule, why string) {
	s.runs.Add(1)
	go func() {
		defer s.runs.Done()
		run, err := s.run(context.Background(), sc)
		if err != nil {
			s.log.Warn("scheduled run failed to start", "schedule", sc.ID, "why", why, "err", err)
			return
		}
		s.log.Info("scheduled run ended", "schedule", sc.ID, "why", why, "run", run.ID, "state", run.State)
	}()
}

// run executes sc's action through the pipeline and notes the run on the
// schedule. It is the one path of cron slots, missed slots and Trigger.
func (s *Scheduler) run(ctx context.Context, sc api.Schedule) (api.Run, error) {
	exe, err := s.p.startAction(ctx, api.TriggerSchedule, "schedule:"+sc.ID, sc.Tenant, sc.RunAction, nil, nil)
	if err != nil {
		return api.Run{}, err
	}
	s.mu.Lock()
	e, ok := s.entries[sc.ID]
	var upd api.Schedule
	if ok {
		e.s.LastRunID = exe.ID
		upd = e.s
	}
	s.mu.Unlock()
	if ok {
		if err := s.st.PutSchedule(context.WithoutCancel(ctx), upd); err != nil {
			s.log.Warn("noting a schedule's last run", "schedule", sc.ID, "err", err)
		}
	}
	return s.p.Wait(ctx, exe)
}

// Wait waits for the runs under way to end (tests).
func (s *Scheduler) Wait() { s.runs.Wait() }

func (s *Scheduler) save(ctx context.Context, e *schedEntry) error {
	s.mu.Lock()
	sc := e.s
	s.mu.Unlock()
	return s.st.PutSchedule(ctx, sc)
}

// Create validates, stores and arms a schedule.
func (s *Scheduler) Create(ctx context.Context, req api.CreateScheduleRequest) (api.Schedule, error) {
	sched, loc, err := parseSchedule(req.Cron, req.Timezone)
	if err != nil {
		return api.Schedule{}, err
	}
	switch req.MissedRunPolicy {
	case "":
		req.MissedRunPolicy = api.MissedRunSkip
	case api.MissedRunSkip, api.MissedRunRunOnce:
	default:
		return api.Schedule{}, fmt.Errorf("missed_run_policy %q: must be %q or %q: %w", req.MissedRunPolicy, api.MissedRunSkip, api.MissedRunRunOnce, errdefs.ErrInvalidArgument)
	}
	if err := validAction(req.RunAction); err != nil {
		return api.Schedule{}, err
	}
	now := s.clk.Now()
	if nextSlot(sched, now).IsZero() {
		return api.Schedule{}, fmt.Errorf("cron %q never fires: %w", req.Cron, errdefs.ErrInvalidArgument)
	}
	e := &schedEntry{sched: sched, s: api.Schedule{
		ID:              newTriggerID("sch"),
		Cron:            req.Cron,
		Timezone:        loc.String(),
		MissedRunPolicy: req.MissedRunPolicy,
		RunAction:       req.RunAction,
		Tenant:          tenant.From(ctx).Tenant,
		CreatedAt:       now.UTC(),
	}}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return api.Schedule{}, fmt.Errorf("scheduler is closed: %w", errdefs.ErrUnavailable)
	}
	s.armLocked(e, now)
	sc := e.s
	s.mu.Unlock()
	if err := s.st.PutSchedule(ctx, sc); err != nil {
		s.mu.Lock()
		e.timer.Stop()
		s.mu.Unlock()
		return api.Schedule{}, err
	}
	s.mu.Lock()
	s.entries[sc.ID] = e
	s.mu.Unlock()
	s.log.InfoContext(ctx, "schedule created", "schedule", sc.ID, "cron", sc.Cron, "timezone", sc.Timezone, "next", sc.NextRunAt)
	return sc, nil
}

// List returns the schedules ordered by id.
func (s *Scheduler) List(ctx context.Context) ([]api.Schedule, error) {
	p := tenant.From(ctx)
	s.mu.Lock()
	out := make([]api.Schedule, 0, len(s.entries))
	for _, e := range s.entries {
		if p.Sees(e.s.Tenant) {
			out = append(out, e.s)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b api.Schedule) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Get returns one schedule. Another tenant's schedule is ErrNotFound like
// an unknown id.
func (s *Scheduler) Get(ctx context.Context, id string) (api.Schedule, error) {
	s.mu.Lock()
	e, ok := s.entries[id]
	var sc api.Schedule
	if ok {
		sc = e.s
	}
	s.mu.Unlock()
	if !ok {
		var err error
		if sc, err = s.st.GetSchedule(ctx, id); err != nil {
			return api.Schedule{}, err
		}
	}
	if !tenant.From(ctx).Sees(sc.Tenant) {
		return api.Schedule{}, fmt.Errorf("schedule %s: %w", id, errdefs.ErrNotFound)
	}
	return sc, nil
}

// Delete stops and removes a schedule; runs under way go on.
func (s *Scheduler) Delete(ctx context.Context, id string) error {
	if _, err := s.Get(ctx, id); err != nil {
		return err
	}
	if err := s.st.DeleteSchedule(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	if e, ok := s.entries[id]; ok {
		if e.timer != nil {
			e.timer.Stop()
		}
		delete(s.entries, id)
	}
	s.mu.Unlock()
	return nil
}

// Trigger runs schedule id now, on the same path as a cron slot (the
// slot bookkeeping aside: the next slot is unchanged), and returns the
// finished run.
func (s *Scheduler) Trigger(ctx context.Context, id string) (api.Run, error) {
	sc, err := s.Get(ctx, id)
	if err != nil {
		return api.Run{}, err
	}
	return s.run(ctx, sc)
}
