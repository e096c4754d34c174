package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Background processes and the idle policy.
//
// A background process still running in the sandbox (started with exec
// -d, or left running by a command) is activity: under the default policy the idle policy
// neither pauses, hibernates nor deletes a sandbox that runs one, and it
// never hibernates or deletes a sandbox that was paused (by hand) while
// one ran, since that would kill it. IdlePolicy.IgnoreBackground turns
// this off: only calls and open streams count, as they did before.
//
// Whether one runs is asked of the guest, PID 1 of the sandbox, which
// sees every process in it (proto.OpActivity: a process a command left
// running, "server &" or double-forked, counts too; a guest older than
// that call is asked for the processes it started, `agentbox ps`), at the
// moment an idle step falls due, never guessed from what the daemon saw:
// a process that exits on its own is noticed at the next step. A busy
// sandbox's idle clock restarts at each look, so once its last background
// process has ended the policy acts within one step more than it would
// have counted from the end of the last call.

// backgroundTimeout bounds the guest call that looks for background
// processes.
const backgroundTimeout = 10 * time.Second

// ignoresBackgroundLocked reports whether b's policy lets background processes
// go to sleep with it. b.mu is held.
func (b *box) ignoresBackgroundLocked() bool {
	p := b.rec.Sandbox.Idle
	return p != nil && p.IgnoreBackground
}

// runningBackground asks b's guest how many processes live in the
// sandbox besides itself (whoever started them: exec -d, or what a
// command left running), and describes the first. A guest too old to
// tell is asked for the processes it started that still run. b.life is
// held; b runs.
func (m *Manager) runningBackground(ctx context.Context, b *box) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout)
	defer cancel()
	act, err := b.guest.Activity(ctx)
	if err == nil {
		first := ""
		if len(act.Sample) > 0 {
			first = "pid " + act.Sample[0]
		}
		return act.Processes, first, nil
	}
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		return 0, "", fmt.Errorf("asking the guest for its processes: %w", err)
	}
	ps, err := b.guest.Processes(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("listing the guest's processes: %w", err)
	}
	n, first := 0, ""
	for _, p := range ps {
		if p.Running {
			if n == 0 {
				first = fmt.Sprintf("pid %d (%s)", p.Pid, commandOf(api.ExecRequest{Cmd: p.Cmd}))
			}
			n++
		}
	}
	return n, first, nil
}

// keepsAwake reports whether b, in state, must not be moved deeper by the
// idle policy because of its background processes, and why. b.life is
// held exclusively.
func (m *Manager) keepsAwake(ctx context.Context, b *box, state string) (bool, string) {
	b.mu.Lock()
	ignore, pausedBusy, id := b.ignoresBackgroundLocked(), extraOf(b.rec).PausedBusy, b.rec.Sandbox.ID
	b.mu.Unlock()
	switch {
	case ignore:
		return false, ""
	case state == api.StatePaused:
		return pausedBusy, "paused while a background process ran"
	case state != api.StateRunning:
		return false, "" // hibernated, stopped, failed: no process runs
	}
	n, first, err := m.runningBackground(ctx, b)
	if err != nil {
		// Not knowing is no licence to kill: stay awake, look again at
		// the next step.
		m.log.WarnContext(ctx, "idle policy: cannot tell whether background processes run; staying awake", "sandbox", id, "err", err)
		return true, "guest did not answer"
	}
	if n == 0 {
		return false, ""
	}
	return true, fmt.Sprintf("%d background process(es) running, first %s", n, first)
}

// notePausedBusy records in b's record, as it is paused for cause,
// whether a background process runs (the policy permitting), so that the
// idle policy does not hibernate or delete it later, when the frozen
// guest cannot be asked. The idle policy pauses only a sandbox it found
// without one, and a warm pool only one it just made: the guest is asked
// on the other causes (an API call, an upgrade). b.life is held
// exclusively and b runs.
func (m *Manager) notePausedBusy(ctx context.Context, b *box, cause string) {
	b.mu.Lock()
	ignore, id := b.ignoresBackgroundLocked(), b.rec.Sandbox.ID
	b.mu.Unlock()
	busy := false
	if !ignore && cause != api.CauseIdle && cause != api.CausePool {
		n, _, err := m.runningBackground(ctx, b)
		if err != nil {
			m.log.WarnContext(ctx, "pausing: cannot tell whether background processes run; assuming they do", "sandbox", id, "err", err)
		}
		busy = n > 0 || err != nil
	}
	b.mu.Lock()
	x := extraOf(b.rec)
	x.PausedBusy = busy
	setExtra(&b.rec, x)
	b.mu.Unlock()
}
