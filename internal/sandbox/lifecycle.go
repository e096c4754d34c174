package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// The lifecycle state machine (states and causes: api/lifecycle.go).
//
//	creating → running ⇄ paused ⇄ hibernated → deleted;  failed, stopped
//
// Paused (warm) freezes the sandbox's cgroup (runtime.Pauser): processes and
// memory stay. Hibernated (cold) stops the guest and every process through
// the same code path restore uses (guestctl.go); the layers and the writable
// upper dir stay on disk and nothing is resident. Waking a hibernated
// sandbox starts a guest again on the same layers and upper dir under the
// same id, hostname and socket.
//
// Every operation that changes the state holds the sandbox's lifecycle
// lock (box.life) exclusively, so there is one at a time per sandbox and
// none overlaps the set-up of an exec or file call (which hold it shared).
// Every transition is appended with its cause to the record's bounded
// transition log and persisted.
//
// Idle policy: a sandbox is idle while no call is being set up, no exec
// or attach stream is open (box.lc.active == 0) and, unless its policy
// says IgnoreBackground, no background process runs (background.go).
// After pause_after, hibernate_after and delete_after of idleness (counted
// from the end of the last activity) it is moved to the deepest state due. acquire, the single
// entry of every exec, file and attach call, wakes a sleeping sandbox
// first. The hard lifetime (ttl, timeout_seconds) does not run while the
// sandbox sleeps unless IdlePolicy.TTLCountsAsleep. Timers come from
// Config.Clock so tests need no sleeps.

// Lifecycle defaults and limits.
const (
	maxTransitions = 64
	// DefaultPauseAfter is the idle time after which both presets pause.
	DefaultPauseAfter = 5 * time.Minute
	// DefaultSessionDeleteAfter is when an idle session sandbox is deleted.
	DefaultSessionDeleteAfter = 30 * time.Minute
	// DefaultPersistentHibernateAfter is when an idle persistent sandbox
	// is hibernated.
	DefaultPersistentHibernateAfter = 30 * time.Minute
	maxIdleSeconds                  = int64(maxTimeout / time.Second)
)

// lifecycleState is the Manager's lifecycle state.
type lifecycleState struct {
	// nameMu serialises creates by name: two creates of one name make one
	// sandbox.
	nameMu sync.Mutex
}

// boxLifecycle is one sandbox's idle accounting; box.mu guards it.
type boxLifecycle struct {
	active     int         // calls being set up and streams open
	lastActive time.Time   // end of the last activity
	idle       clock.Timer // the next idle step, when one is due
	gen        uint64      // bumped when idle is stopped: a stale callback does nothing
}

func asleep(state string) bool { return state == api.StatePaused || state == api.StateHibernated }

// depth orders states by how far from running they are: the idle policy
// only moves a sandbox deeper.
func depth(state string) int {
	switch state {
	case api.StateRunning:
		return 0
	case api.StatePaused:
		return 1
	case api.StateHibernated, api.StateStopped, api.StateFailed:
		return 2
	}
	return 3
}

type idleStep struct {
	after time.Duration
	to    string
}

// idleSteps returns the steps of an effective policy (0: never).
func idleSteps(p *api.IdlePolicy) []idleStep {
	if p == nil {
		return nil
	}
	var out []idleStep
	for _, s := range []struct {
		sec int64
		to  string
	}{{p.PauseAfterSeconds, api.StatePaused}, {p.HibernateAfterSeconds, api.StateHibernated}, {p.DeleteAfterSeconds, api.StateDeleted}} {
		if s.sec > 0 {
			out = append(out, idleStep{time.Duration(s.sec) * time.Second, s.to})
		}
	}
	return out
}

// nextIdle returns when policy p next acts on a sandbox in state that has
// been idle since since; false when it never will.
func nextIdle(p *api.IdlePolicy, state string, since time.Time) (time.Time, bool) {
	best := time.Duration(-1)
	for _, s := range idleSteps(p) {
		if depth(s.to) > depth(state) && (best < 0 || s.after < best) {
			best = s.after
		}
	}
	if best < 0 {
		return time.Time{}, false
	}
	return since.Add(best), true
}

// dueIdle returns the deepest state policy p sends a sandbox in state to
// after idle of idleness; "" when no step is due.
func dueIdle(p *api.IdlePolicy, state string, idle time.Duration) string {
	to := ""
	for _, s := range idleSteps(p) {
		if s.after <= idle && depth(s.to) > depth(state) && (to == "" || depth(s.to) > depth(to)) {
			to = s.to
		}
	}
	return to
}

// resolveLifecycle validates req's lifecycle fields and replaces req.Idle
// by the effective policy: the preset's defaults with req's overrides
// (-1 = never, which is 0 in the effective policy).
func (m *Manager) resolveLifecycle(req *api.CreateSandboxRequest) error {
	switch req.Lifecycle {
	case "":
		req.Lifecycle = api.LifecycleSession
	case api.LifecycleSession, api.LifecyclePersistent:
	default:
		return fmt.Errorf("lifecycle %q must be %q or %q: %w", req.Lifecycle, api.LifecycleSession, api.LifecyclePersistent, errdefs.ErrInvalidArgument)
	}
	if req.Name != "" {
		if err := ValidName(req.Name); err != nil {
			return err
		}
	}
	eff := api.IdlePolicy{PauseAfterSeconds: int64(DefaultPauseAfter / time.Second)}
	if req.Lifecycle == api.LifecycleSession {
		eff.DeleteAfterSeconds = int64(DefaultSessionDeleteAfter / time.Second)
	} else {
		eff.HibernateAfterSeconds = int64(DefaultPersistentHibernateAfter / time.Second)
	}
	if o := req.Idle; o != nil {
		for _, f := range []struct {
			name string
			in   int64
			out  *int64
		}{
			{"pause_after_seconds", o.PauseAfterSeconds, &eff.PauseAfterSeconds},
			{"hibernate_after_seconds", o.HibernateAfterSeconds, &eff.HibernateAfterSeconds},
			{"delete_after_seconds", o.DeleteAfterSeconds, &eff.DeleteAfterSeconds},
		} {
			switch {
			case f.in < -1 || f.in > maxIdleSeconds:
				return fmt.Errorf("idle.%s must be -1 (never), 0 (default) or up to %d: %w", f.name, maxIdleSeconds, errdefs.ErrInvalidArgument)
			case f.in == -1:
				*f.out = 0
			case f.in > 0:
				*f.out = f.in
			}
		}
		eff.TTLCountsAsleep = o.TTLCountsAsleep
		eff.IgnoreBackground = o.IgnoreBackground
	}
	be, err := m.backends.Lookup(req.Runtime)
	if err != nil {
		return err
	}
	if !be.Capabilities().Has(runtime.CapPause) {
		eff.PauseAfterSeconds = 0 // the backend cannot freeze: skip the warm step
	}
	req.Idle = &eff
	return nil
}

// addTransition appends t to rec's bounded transition log.
func addTransition(rec *store.SandboxRecord, t api.Transition) {
	rec.Transitions = append(rec.Transitions, t)
	if n := len(rec.Transitions); n > maxTransitions {
		rec.Transitions = append([]api.Transition(nil), rec.Transitions[n-maxTransitions:]...)
	}
	rec.Sandbox.LastTransition = &t
}

// setStateLocked moves b to state to, recording the transition, and moves
// the hard lifetime in and out of sleep. b.mu is held; the caller persists.
func (m *Manager) setStateLocked(b *box, to, cause, detail string) {
	now := m.cfg.Clock.Now().UTC()
	sb := &b.rec.Sandbox
	from := sb.State
	sb.State = to
	t := api.Transition{From: from, To: to, Cause: cause, Detail: detail, At: now}
	addTransition(&b.rec, t)
	m.observe(context.Background(), Op{Kind: OpTransition, Sandbox: sb.ID, Tenant: tenant.Owner(sb.Tenant), Transition: &t, At: now})
	countsAsleep := sb.Idle != nil && sb.Idle.TTLCountsAsleep
	switch {
	case asleep(to) && !asleep(from) && !countsAsleep && sb.ExpiresAt != nil:
		b.rec.TTLLeft = max(sb.ExpiresAt.Sub(now), time.Millisecond)
		sb.ExpiresAt = nil
		if b.expiry != nil {
			b.expiry.Stop()
			b.expiry = nil
		}
	case !asleep(to) && asleep(from) && b.rec.TTLLeft > 0:
		exp := now.Add(b.rec.TTLLeft)
		sb.ExpiresAt = &exp
		b.rec.TTLLeft = 0
		m.scheduleTTLLocked(b)
	}
	m.log.Info("sandbox state changed", "sandbox", sb.ID, "from", from, "to", to, "cause", cause, "detail", detail)
}

// transition does setStateLocked, persists the record and schedules the
// next idle step.
func (m *Manager) transition(ctx context.Context, b *box, to, cause, detail string) error {
	b.mu.Lock()
	m.setStateLocked(b, to, cause, detail)
	m.scheduleIdleLocked(b)
	b.mu.Unlock()
	return m.saveLocked(ctx, b)
}

// startTimersLocked starts b's lifetime and idle timers (register).
func (m *Manager) startTimersLocked(b *box) {
	b.lc.lastActive = m.cfg.Clock.Now()
	m.scheduleTTLLocked(b)
	m.scheduleIdleLocked(b)
}

// scheduleTTLLocked (re)arms b's hard lifetime timer.
func (m *Manager) scheduleTTLLocked(b *box) {
	if b.expiry != nil {
		b.expiry.Stop()
		b.expiry = nil
	}
	exp := b.rec.Sandbox.ExpiresAt
	if exp == nil || b.deleted {
		return
	}
	at := *exp
	b.expiry = m.cfg.Clock.AfterFunc(at.Sub(m.cfg.Clock.Now()), func() { m.expire(b, at) })
}

// expire deletes b when its lifetime ending at at has run out.
func (m *Manager) expire(b *box, at time.Time) {
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	exp, deleted, id := b.rec.Sandbox.ExpiresAt, b.deleted, b.rec.Sandbox.ID
	b.mu.Unlock()
	if deleted || exp == nil || !exp.Equal(at) {
		return
	}
	m.log.Info("sandbox timeout reached; deleting", "sandbox", id)
	if err := m.deleteLocked(context.Background(), b, api.CauseTTL); err != nil && !errdefs.IsNotFound(err) {
		m.log.Error("deleting expired sandbox", "sandbox", id, "err", err)
	}
}

// stopIdleLocked cancels b's pending idle step.
func (b *box) stopIdleLocked() {
	if b.lc.idle != nil {
		b.lc.idle.Stop()
		b.lc.idle = nil
	}
	b.lc.gen++
}

// scheduleIdleLocked arms b's next idle step, unless b is busy.
func (m *Manager) scheduleIdleLocked(b *box) {
	b.stopIdleLocked()
	if b.deleted || b.lc.active > 0 {
		return
	}
	at, ok := nextIdle(b.rec.Sandbox.Idle, b.rec.Sandbox.State, b.lc.lastActive)
	if !ok {
		return
	}
	gen := b.lc.gen
	b.lc.idle = m.cfg.Clock.AfterFunc(at.Sub(m.cfg.Clock.Now()), func() { m.idleStep(b, gen) })
}

// busy counts an activity on b (a call or an open stream) until the
// returned function is called (once; further calls do nothing).
func (m *Manager) busy(b *box) func() {
	b.mu.Lock()
	b.lc.active++
	b.stopIdleLocked()
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { m.idleFrom(b) }) }
}

// holdStream keeps b busy until s is closed: an open exec or attach stream
// is activity.
func (m *Manager) holdStream(b *box, s execstream.Stream) execstream.Stream {
	return &busyStream{Stream: m.watchOOM(b, s), done: m.busy(b)}
}

type busyStream struct {
	execstream.Stream
	done func()
}

// Close implements execstream.Stream.
func (s *busyStream) Close() error {
	err := s.Stream.Close()
	s.done()
	return err
}

// idleFrom ends one activity on b: the idle clock restarts now.
func (m *Manager) idleFrom(b *box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lc.active--
	b.lc.lastActive = m.cfg.Clock.Now()
	m.scheduleIdleLocked(b)
}

// idleStep applies the idle policy to b: the timer armed with gen fired.
func (m *Manager) idleStep(b *box, gen uint64) {
	ctx := context.Background()
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	if b.deleted || b.lc.gen != gen || b.lc.active > 0 {
		b.mu.Unlock()
		return
	}
	idle := m.cfg.Clock.Now().Sub(b.lc.lastActive)
	state := b.rec.Sandbox.State
	to := dueIdle(b.rec.Sandbox.Idle, state, idle)
	id := b.rec.Sandbox.ID
	b.mu.Unlock()
	if to != "" {
		if awake, why := m.keepsAwake(ctx, b, state); awake {
			m.log.Debug("idle policy: sandbox kept awake", "sandbox", id, "due", to, "why", why)
			b.mu.Lock()
			defer b.mu.Unlock()
			if state == api.StatePaused {
				b.stopIdleLocked() // nothing to look at until it is woken
				return
			}
			b.lc.lastActive = m.cfg.Clock.Now() // look again one step later
			m.scheduleIdleLocked(b)
			return
		}
	}
	detail := "idle " + idle.Round(time.Second).String()
	var err error
	switch to {
	case api.StatePaused:
		err = m.pauseLocked(ctx, b, api.CauseIdle, detail)
	case api.StateHibernated:
		err = m.hibernateLocked(ctx, b, api.CauseIdle, detail)
	case api.StateDeleted:
		m.log.Info("sandbox idle; deleting", "sandbox", id, "idle", idle)
		if err = m.deleteLocked(ctx, b, api.CauseIdle); err == nil {
			return
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		// Not retried before the next activity: a failing step must not spin.
		m.log.Error("applying idle policy", "sandbox", id, "to", to, "err", err)
		b.stopIdleLocked()
		return
	}
	m.scheduleIdleLocked(b)
}

// lockLive takes sandbox id's lifecycle lock exclusively; it must not be
// deleted. The caller calls unlock.
func (m *Manager) lockLive(ctx context.Context, id string) (*box, func(), error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	b.life.Lock()
	b.mu.Lock()
	deleted := b.deleted
	b.mu.Unlock()
	if deleted {
		b.life.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return b, b.life.Unlock, nil
}

// SetState moves sandbox id to state to, as an API call asks (cause
// api.CauseAPI), and returns the sandbox as it then is:
//
//   - api.StatePaused freezes every process of a running sandbox; its
//     memory is kept. Pausing a paused sandbox does nothing; any other
//     state is ErrConflict. Backends without runtime.Pauser:
//     ErrFailedPrecondition.
//   - api.StateHibernated stops a running or paused sandbox's guest and
//     every process, keeping its filesystem on disk. Hibernating a
//     hibernated sandbox does nothing.
//   - api.StateRunning brings a paused or hibernated sandbox back to
//     running; a stopped or failed one is restarted on its filesystem.
//     Resuming a running sandbox does nothing.
//
// Any other state is ErrInvalidArgument. It takes the sandbox's operation
// lock exclusively.
func (m *Manager) SetState(ctx context.Context, id, to string) (api.Sandbox, error) {
	var change func(b *box) error
	switch to {
	case api.StatePaused:
		change = func(b *box) error { return m.pauseLocked(ctx, b, api.CauseAPI, "") }
	case api.StateHibernated:
		change = func(b *box) error { return m.hibernateLocked(ctx, b, api.CauseAPI, "") }
	case api.StateRunning:
		change = func(b *box) error { return m.wakeLocked(ctx, b, api.CauseAPI, "", true) }
	default:
		return api.Sandbox{}, fmt.Errorf("sandbox %s: cannot be set %q: %w", id, to, errdefs.ErrInvalidArgument)
	}
	b, unlock, err := m.lockLive(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	if err := change(b); err != nil {
		return api.Sandbox{}, err
	}
	return b.view(), nil
}

// Transitions returns the sandbox's newest state transitions, oldest
// first (a copy).
func (h *Handle) Transitions() []api.Transition {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return append([]api.Transition{}, h.b.rec.Transitions...)
}

// pauseLocked freezes b (b.life held exclusively).
func (m *Manager) pauseLocked(ctx context.Context, b *box, cause, detail string) error {
	b.mu.Lock()
	state, rt, id, backend := b.rec.Sandbox.State, b.rt, b.rec.Sandbox.ID, m.backendName(b.rec)
	b.mu.Unlock()
	switch state {
	case api.StatePaused:
		return nil
	case api.StateRunning:
	default:
		return fmt.Errorf("pausing sandbox %s: it is %s: %w", id, state, errdefs.ErrConflict)
	}
	p, ok := rt.(runtime.Pauser)
	if !ok {
		return fmt.Errorf("pausing sandbox %s: backend %s cannot freeze: %w", id, backend, errdefs.ErrFailedPrecondition)
	}
	m.notePausedBusy(ctx, b, cause)
	if err := p.Pause(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	if err := m.transition(ctx, b, api.StatePaused, cause, detail); err != nil {
		return err
	}
	m.onStop(ctx, b, api.StatePaused)
	return nil
}

// hibernateLocked stops b's guest, keeping its filesystem (b.life held
// exclusively). When the guest cannot be stopped the sandbox is failed.
func (m *Manager) hibernateLocked(ctx context.Context, b *box, cause, detail string) error {
	b.mu.Lock()
	state, id := b.rec.Sandbox.State, b.rec.Sandbox.ID
	b.mu.Unlock()
	switch state {
	case api.StateHibernated:
		return nil
	case api.StateRunning, api.StatePaused:
	default:
		return fmt.Errorf("hibernating sandbox %s: it is %s: %w", id, state, errdefs.ErrConflict)
	}
	old, err := m.stopGuestLocked(ctx, b)
	if err != nil {
		b.mu.Lock()
		b.rt = old
		b.mu.Unlock()
		if terr := m.transition(ctx, b, api.StateFailed, api.CauseError, "hibernate failed"); terr != nil {
			m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", id, "err", terr)
		}
		return fmt.Errorf("hibernating sandbox %s: %w", id, err)
	}
	b.mu.Lock()
	b.rec.RuntimeState = nil
	b.mu.Unlock()
	if err := m.unmountDisk(id); err != nil { // nothing of it stays resident
		m.log.WarnContext(ctx, "hibernating sandbox", "sandbox", id, "err", err)
	}
	if err := m.transition(ctx, b, api.StateHibernated, cause, detail); err != nil {
		return err
	}
	m.onStop(ctx, b, api.StateHibernated)
	return nil
}

// wake brings a paused or hibernated sandbox back to running.
func (m *Manager) wake(ctx context.Context, b *box, cause, detail string) error {
	b.life.Lock()
	defer b.life.Unlock()
	return m.wakeLocked(ctx, b, cause, detail, false)
}

// wakeIfAsleep wakes b when it is paused or hibernated; what names the
// call that wakes it.
func (m *Manager) wakeIfAsleep(b *box, what string) error {
	b.mu.Lock()
	state := b.rec.Sandbox.State
	b.mu.Unlock()
	if !asleep(state) {
		return nil
	}
	return m.wake(context.Background(), b, api.CauseWake, what)
}

// wakeLocked does wake with b.life held exclusively; with restart, a
// stopped or failed sandbox is started again too. The idle clock restarts.
func (m *Manager) wakeLocked(ctx context.Context, b *box, cause, detail string, restart bool) error {
	ctx = context.WithoutCancel(ctx)
	b.mu.Lock()
	state, deleted, rt, id, layers := b.rec.Sandbox.State, b.deleted, b.rt, b.rec.Sandbox.ID, b.rec.Layers
	b.mu.Unlock()
	start := time.Now()
	switch {
	case deleted:
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	case state == api.StateRunning:
		b.mu.Lock()
		b.lc.lastActive = m.cfg.Clock.Now()
		m.scheduleIdleLocked(b)
		b.mu.Unlock()
		return nil
	case state == api.StatePaused:
		p, ok := rt.(runtime.Pauser)
		if !ok {
			return fmt.Errorf("resuming sandbox %s: backend cannot thaw: %w", id, errdefs.ErrFailedPrecondition)
		}
		if err := p.Resume(ctx); err != nil {
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	case state == api.StateHibernated || restart && (state == api.StateStopped || state == api.StateFailed):
		if rt != nil {
			if _, err := m.stopGuestLocked(ctx, b); err != nil {
				return fmt.Errorf("restarting sandbox %s: %w", id, err)
			}
		} else if state != api.StateHibernated {
			if err := m.cleanupRuntime(ctx, b.rec); err != nil {
				return fmt.Errorf("restarting sandbox %s: %w", id, err)
			}
		}
		if err := m.startGuestLocked(ctx, b, layers); err != nil {
			if terr := m.transition(ctx, b, api.StateFailed, api.CauseError, "guest did not start"); terr != nil {
				m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", id, "err", terr)
			}
			return fmt.Errorf("waking sandbox %s: %w", id, err)
		}
		// The egress CA lived in the backend's state dir: configure the
		// edge again and put the CA back into the sandbox.
		m.onStart(ctx, b, cause)
	default:
		return fmt.Errorf("waking sandbox %s: it is %s: %w", id, state, errdefs.ErrConflict)
	}
	b.mu.Lock()
	b.lc.lastActive = m.cfg.Clock.Now()
	b.mu.Unlock()
	if err := m.transition(ctx, b, api.StateRunning, cause, detail); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "sandbox woken", "sandbox", id, "from", state, "ms", time.Since(start).Milliseconds())
	return nil
}
