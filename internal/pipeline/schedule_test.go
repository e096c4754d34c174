package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

func paris(t *testing.T) *time.Location {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestCronNextInTimeZone(t *testing.T) {
	loc := paris(t)
	sched, _, err := parseSchedule("0 9 * * 1", "Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, want time.Time }{
		// Winter: Paris is UTC+1, so 09:00 Paris is 08:00 UTC.
		{time.Date(2030, 1, 7, 7, 30, 0, 0, time.UTC), time.Date(2030, 1, 7, 8, 0, 0, 0, time.UTC)},
		// Just after the slot: next Monday.
		{time.Date(2030, 1, 7, 8, 0, 0, 0, time.UTC), time.Date(2030, 1, 14, 8, 0, 0, 0, time.UTC)},
		// Summer: UTC+2, 07:00 UTC.
		{time.Date(2030, 7, 1, 0, 0, 0, 0, time.UTC), time.Date(2030, 7, 1, 7, 0, 0, 0, time.UTC)},
		// Across the DST change (Sunday 31 March 2030): the Monday after is
		// at 07:00 UTC though the week started in winter time.
		{time.Date(2030, 3, 26, 0, 0, 0, 0, time.UTC), time.Date(2030, 4, 1, 7, 0, 0, 0, time.UTC)},
	} {
		got := nextSlot(sched, c.from)
		if !got.Equal(c.want) {
			t.Errorf("next after %s = %s, want %s", c.from, got.UTC(), c.want)
		}
		if l := got.In(loc); l.Hour() != 9 || l.Weekday() != time.Monday {
			t.Errorf("slot %s is not Monday 09:00 in Paris", l)
		}
	}
	for _, bad := range []struct{ cron, tz string }{
		{"0 9 * *", ""}, {"61 * * * *", ""}, {"0 9 * * 1", "Mars/Olympus"}, {"TZ=UTC 0 9 * * 1", ""}, {"0 9 * * 1", "Local"},
	} {
		if _, _, err := parseSchedule(bad.cron, bad.tz); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q %q: %v", bad.cron, bad.tz, err)
		}
	}
}

func TestScheduleFiresWithFakeClock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := NewScheduler(e.p)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc, err := s.Create(ctx, api.CreateScheduleRequest{Cron: "0 9 * * 1", Timezone: "Europe/Paris",
		RunAction: api.RunAction{Template: "busybox", Cmd: []string{"echo", "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sc.NextRunAt == nil || !sc.NextRunAt.Equal(time.Date(2030, 1, 7, 8, 0, 0, 0, time.UTC)) || sc.MissedRunPolicy != api.MissedRunSkip {
		t.Fatalf("schedule %+v", sc)
	}
	e.clk.Advance(29 * time.Minute)
	s.Wait()
	if n := e.sbx.execCount(); n != 0 {
		t.Fatalf("fired early: %d", n)
	}
	e.clk.Advance(time.Minute) // 08:00 UTC = 09:00 Paris
	s.Wait()
	if n := e.sbx.execCount(); n != 1 {
		t.Fatalf("runs after the slot: %d", n)
	}
	runs, _ := e.p.List(ctx, store.RunFilter{Trigger: api.TriggerSchedule})
	if len(runs) != 1 || runs[0].Who != "schedule:"+sc.ID || runs[0].State != api.RunFinished || string(runs[0].Output) != "ok" {
		t.Fatalf("run %+v", runs)
	}
	got, _ := s.Get(ctx, sc.ID)
	if got.LastRunID != runs[0].ID || !got.NextRunAt.Equal(time.Date(2030, 1, 14, 8, 0, 0, 0, time.UTC)) {
		t.Fatalf("after firing: %+v", got)
	}
	// Two more weeks: two more runs, one per slot.
	e.clk.Advance(14 * 24 * time.Hour)
	s.Wait()
	if n := e.sbx.execCount(); n != 3 {
		t.Fatalf("runs after three slots: %d", n)
	}
	// Trigger takes the same path and leaves the slots alone.
	r, err := s.Trigger(ctx, sc.ID)
	if err != nil || r.Trigger != api.TriggerSchedule || r.Who != "schedule:"+sc.ID || r.State != api.RunFinished {
		t.Fatalf("trigger: %+v %v", r, err)
	}
	// Deleted: no more runs.
	if err := s.Delete(ctx, sc.ID); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(7 * 24 * time.Hour)
	s.Wait()
	if n := e.sbx.execCount(); n != 4 {
		t.Fatalf("a deleted schedule ran: %d", n)
	}
	if _, err := s.Get(ctx, sc.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
}

// A daemon down across slots: skip runs nothing for them, run_once runs
// once at start-up; both resume at the next slot.
func TestScheduleMissedRunPolicies(t *testing.T) {
	for _, policy := range []string{api.MissedRunSkip, api.MissedRunRunOnce} {
		t.Run(policy, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			s1 := NewScheduler(e.p)
			if err := s1.Start(ctx); err != nil {
				t.Fatal(err)
			}
			sc, err := s1.Create(ctx, api.CreateScheduleRequest{Cron: "0 9 * * 1", Timezone: "Europe/Paris", MissedRunPolicy: policy,
				RunAction: api.RunAction{Command: "date"}})
			if err != nil {
				t.Fatal(err)
			}
			s1.Close() // the daemon stops
			e.clk.Advance(15 * 24 * time.Hour)
			if n := e.sbx.execCount(); n != 0 {
				t.Fatalf("a closed scheduler ran %d", n)
			}
			s2 := NewScheduler(e.newPipeline(t)) // the daemon restarts
			if err := s2.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			s2.Wait()
			want := 0
			if policy == api.MissedRunRunOnce {
				want = 1
			}
			if n := e.sbx.execCount(); n != want {
				t.Fatalf("runs at start-up: %d, want %d", n, want)
			}
			got, _ := s2.Get(ctx, sc.ID)
			// Now is Tuesday 22 January 07:30 UTC; the next slot Monday 28th.
			if got.NextRunAt == nil || !got.NextRunAt.Equal(time.Date(2030, 1, 28, 8, 0, 0, 0, time.UTC)) {
				t.Fatalf("next %v", got.NextRunAt)
			}
			// A third start right away misses nothing: no double run.
			s2.Close()
			s3 := NewScheduler(e.newPipeline(t))
			if err := s3.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer s3.Close()
			s3.Wait()
			if n := e.sbx.execCount(); n != want {
				t.Fatalf("runs after a second restart: %d, want %d", n, want)
			}
			e.clk.Advance(7 * 24 * time.Hour)
			s3.Wait()
			if n := e.sbx.execCount(); n != want+1 {
				t.Fatalf("runs after the next slot: %d, want %d", n, want+1)
			}
		})
	}
}

func TestScheduleValidation(t *testing.T) {
	e := newEnv(t)
	s := NewScheduler(e.p)
	ctx := context.Background()
	for _, req := range []api.CreateScheduleRequest{
		{Cron: "0 9 * * 1"},
		{Cron: "0 9 * * 1", RunAction: api.RunAction{Command: "x", Cmd: []string{"x"}}},
		{Cron: "0 9 * * 1", MissedRunPolicy: "always", RunAction: api.RunAction{Command: "x"}},
		{Cron: "0 9 * * 1", RunAction: api.RunAction{Command: "x", Lifecycle: api.LifecyclePersistent}},
		{Cron: "0 9 * * 1", RunAction: api.RunAction{Command: "x", Lifecycle: "forever", Name: "n"}},
		{Cron: "bogus", RunAction: api.RunAction{Command: "x"}},
	} {
		if _, err := s.Create(ctx, req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v", req, err)
		}
	}
}
