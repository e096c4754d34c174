package pipeline

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
)

// lostError ends a run whose end no daemon saw and whose process is gone
// without an exit status: its record is api.RunLost.
type lostError struct{ msg string }

func (e lostError) Error() string { return e.msg }

// notePid journals the process of the run (once per run).
func (rs *runState) notePid(pid int) {
	if pid <= 0 {
		return
	}
	rs.pidOnce.Do(func() {
		if err := rs.p.journal.pid(rs.rec.ID, pid); err != nil {
			rs.p.log.Warn("journaling a run's process", "run", rs.rec.ID, "pid", pid, "err", err)
		}
	})
}

// Recover reconciles the runs the run journal holds open: a previous
// daemon started them and did not see them end. Each one's record is
// running again at once (readers see it, and ReapOrphans keeps its
// sandbox); then its process is asked after in its sandbox's guest:
//
//   - still running: the record stays running, is metered from the
//     counters journaled at its start, and finishes when the process
//     exits, like any run;
//   - exited meanwhile: the guest keeps the exit status, and the record
//     is finished with it;
//   - gone (the sandbox was deleted, hibernated or restarted, or the
//     daemon stopped before the guest named the process): the record is
//     api.RunLost.
//
// A run's own sandbox (ephemeral) is deleted once its record is
// finished. Call Recover once at start-up, after the sandboxes are
// recovered and before ReapOrphans and any trigger.
func (p *Pipeline) Recover(ctx context.Context) {
	runs := p.recovered
	p.recovered = nil
	for _, o := range runs {
		p.recoverRun(ctx, o)
	}
	if len(runs) > 0 {
		p.log.InfoContext(ctx, "reconciling runs the previous daemon did not see end", "runs", len(runs))
	}
}

func (p *Pipeline) recoverRun(ctx context.Context, o openRun) {
	// The daemon may have stopped between storing the finished record and
	// journaling its end.
	if stored, err := p.st.GetRun(ctx, o.start.ID); err == nil && stored.State != api.RunRunning {
		if err := p.journal.ended(o.start.ID); err != nil {
			p.log.WarnContext(ctx, "journaling the end of a run", "run", o.start.ID, "err", err)
		}
		return
	}
	rec := cloneRun(o.start.Run)
	rec.State, rec.EndedAt, rec.ExitCode, rec.Error = api.RunRunning, nil, nil, ""
	rs := &runState{p: p, rec: &rec, ephemeral: o.start.Ephemeral, keepOutput: o.start.KeepOutput, done: make(chan struct{})}
	rs.meter.sample(o.start.StatsAt, o.start.Stats)
	rs.pidOnce.Do(func() {}) // its pid is journaled already, or never will be
	p.track(&rec)
	p.mu.Lock()
	if t := rec.StartedAt.UnixNano(); t > p.lastID {
		p.lastID = t
	}
	p.mu.Unlock()
	if o.pid <= 0 {
		rs.finish(nil, lostError{"the daemon stopped as the command started; its process is unknown"})
		return
	}
	// Asked in the background: a paused sandbox's guest answers only once
	// it is resumed.
	go func() {
		s, err := p.sbx.WatchProcess(context.WithoutCancel(ctx), rec.Sandbox, o.pid)
		if err != nil {
			p.log.Info("a run's process is gone after a daemon restart", "run", rec.ID, "sandbox", rec.Sandbox, "pid", o.pid, "err", err)
			rs.finish(nil, lostError{fmt.Sprintf("the daemon stopped during the run and process %d is gone from its sandbox", o.pid)})
			return
		}
		rs.armSampler(rec.Sandbox)
		rs.followStream(s)
	}()
}
