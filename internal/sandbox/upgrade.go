package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/store"
)

// Runner hot-swap (api/upgrade.go): the swap itself. Staging, listing and
// choosing runners is internal/upgrade's, which calls UpgradeGuest
// (core_upgrade.go).
//
// Each sandbox records the runner its guest runs (api.Sandbox.Runner, a
// directory of the runner store next to the daemon's own runner); the
// backend mounts that directory at /.agentbox. New sandboxes get the
// daemon's own runner. An upgrade validates the target runner first
// (runner.Store.Validate: a locked-down self-check) and then, with the
// sandbox's lifecycle lock held exclusively, stops the guest and every
// process (as restore does, through the same stopGuestLocked and
// startGuestLocked), switches the record to the new runner, starts the
// guest over the same layers, upper and work dirs and checks it reports
// exactly the build that passed the self-check. Only then is the record
// saved. On any failure it falls back, in order, to: the previous runner;
// the daemon's own runner; the sandbox's latest checkpoint on the daemon's
// runner (restore). A sandbox is thus never left on a half-upgraded guest:
// it runs the new guest, or a guest that was verified before, or it is
// failed with its record naming its previous runner.
//
// Runner directories are immutable and are not garbage-collected while
// the daemon runs: a sandbox may run any of them.

// defaultRunner is the hash of the daemon's own runner.
func (m *Manager) defaultRunner() string { return filepath.Base(m.cfg.RunnerDir) }

// runnerDir is the runner directory the guest of rec runs; records written
// before runners were recorded run the daemon's own.
func (m *Manager) runnerDir(rec store.SandboxRecord) string {
	if h := rec.Sandbox.Runner; runner.ValidHash(h) {
		return filepath.Join(filepath.Dir(m.cfg.RunnerDir), h)
	}
	return m.cfg.RunnerDir
}

// builds caches the build identity of runner binaries by path (runner
// directories are immutable).
var builds sync.Map

// defaultGuestVersion is what a guest of the daemon's own runner reports:
// the daemon's version and the runner binary's build. A create records it
// without a round trip to the guest; every restart and upgrade asks the
// guest itself.
func (m *Manager) defaultGuestVersion() string {
	bin := filepath.Join(m.cfg.RunnerDir, runner.BinaryName)
	if b, ok := builds.Load(bin); ok {
		return runner.GuestVersion(m.cfg.Version, b.(string))
	}
	b, err := runner.Build(bin)
	if err != nil {
		return m.cfg.Version
	}
	builds.Store(bin, b)
	return runner.GuestVersion(m.cfg.Version, b)
}

// upgradeLocked does UpgradeGuest with b.life held exclusively.
func (m *Manager) upgradeLocked(ctx context.Context, b *box, rn runner.Runner) (api.UpgradeResult, error) {
	ctx = context.WithoutCancel(ctx) // a half-done swap must be finished
	b.mu.Lock()
	state := b.rec.Sandbox.State
	from, fromVersion := b.rec.Sandbox.Runner, b.rec.Sandbox.GuestVersion
	b.mu.Unlock()
	if from == "" {
		from = m.defaultRunner()
	}
	res := api.UpgradeResult{FromRunner: from, ToRunner: rn.Hash, FromVersion: fromVersion, ToVersion: rn.GuestVersion()}
	if from == rn.Hash && fromVersion == rn.GuestVersion() {
		res.ToVersion = fromVersion
		return res, nil
	}
	switch state {
	case api.StateRunning:
	case api.StatePaused, api.StateHibernated:
		// Wake first (a frozen process cannot be killed; a hibernated
		// sandbox has no guest to stop), so that one swap path serves all.
		if err := m.wakeLocked(ctx, b, api.CauseAPI, "upgrade", false); err != nil {
			return res, err
		}
	default:
		return res, fmt.Errorf("it is %s: %w", state, errdefs.ErrConflict)
	}
	if err := m.swapRunnerLocked(ctx, b, from, rn); err != nil {
		return res, err
	}
	res.Changed = true
	if err := m.note(ctx, b, api.CauseUpgrade, clipVersion(fromVersion)+" -> "+clipVersion(rn.GuestVersion())); err != nil {
		m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", b.id(), "err", err)
	}
	switch state {
	case api.StatePaused:
		if err := m.pauseLocked(ctx, b, api.CauseAPI, "upgrade"); err != nil {
			return res, fmt.Errorf("upgraded, but pausing again: %w", err)
		}
	case api.StateHibernated:
		if err := m.hibernateLocked(ctx, b, api.CauseAPI, "upgrade"); err != nil {
			return res, fmt.Errorf("upgraded, but hibernating again: %w", err)
		}
	}
	return res, nil
}

// errUpgradeFailed marks upgrades that failed after the fallback worked.
var errUpgradeFailed = errors.New("upgrade failed")

// swapRunnerLocked restarts b's guest on rn and verifies it; on failure it
// falls back (see the package comment) and reports what b runs now.
func (m *Manager) swapRunnerLocked(ctx context.Context, b *box, from string, rn runner.Runner) error {
	b.mu.Lock()
	id, layers := b.rec.Sandbox.ID, b.rec.Layers
	b.mu.Unlock()
	old, err := m.stopGuestLocked(ctx, b)
	if err != nil {
		b.mu.Lock()
		b.rt = old
		b.mu.Unlock()
		m.failLocked(ctx, b, "upgrade: stopping the guest failed")
		return err
	}
	// start runs the guest of runner hash and checks its version when want
	// is set; on failure nothing of that guest is left.
	start := func(hash, want string) error {
		b.mu.Lock()
		b.rec.Sandbox.Runner = hash
		b.mu.Unlock()
		if err := m.startGuestLocked(ctx, b, layers); err != nil {
			return err
		}
		b.mu.Lock()
		got := b.rec.Sandbox.GuestVersion
		b.mu.Unlock()
		if want != "" && got != want {
			if _, err := m.stopGuestLocked(ctx, b); err != nil {
				m.log.WarnContext(ctx, "stopping a guest of the wrong build", "sandbox", id, "err", err)
			}
			return fmt.Errorf("the new guest reports version %q, want %q", clipVersion(got), want)
		}
		return nil
	}
	// finish makes the running guest b's current state.
	finish := func() error {
		m.onStart(ctx, b, StartUpgrade)
		return m.saveLocked(ctx, b)
	}
	upErr := start(rn.Hash, rn.GuestVersion())
	if upErr == nil {
		return finish()
	}
	m.log.WarnContext(ctx, "new guest failed; rolling back", "sandbox", id, "runner", rn.Hash, "err", upErr)
	err = start(from, "")
	if err == nil {
		if err := finish(); err != nil {
			return err
		}
		return fmt.Errorf("%w: %v; the sandbox runs its previous guest again (runner %s): %w", errUpgradeFailed, upErr, from, errdefs.ErrFailedPrecondition)
	}
	m.log.WarnContext(ctx, "previous guest failed too", "sandbox", id, "runner", from, "err", err)
	if def := m.defaultRunner(); def != from && def != rn.Hash {
		if err := start(def, ""); err == nil {
			if err := finish(); err != nil {
				return err
			}
			return fmt.Errorf("%w: %v; the previous guest did not start either: the sandbox runs the daemon's guest (runner %s): %w", errUpgradeFailed, upErr, def, errdefs.ErrFailedPrecondition)
		}
	}
	// The sandbox's own filesystem does not take a guest: an extension
	// (the checkpoint feature) may recreate it from its latest checkpoint.
	b.mu.Lock()
	b.rec.Sandbox.Runner = m.defaultRunner()
	b.mu.Unlock()
	if to, ok := m.rescue(ctx, b); ok {
		m.setStateAndSave(ctx, b, api.StateRunning, "upgrade failed; restored latest checkpoint")
		return fmt.Errorf("%w: %v; no guest started on the sandbox's files: it was restored to its latest checkpoint %s: %w", errUpgradeFailed, upErr, to, errdefs.ErrFailedPrecondition)
	}
	b.mu.Lock()
	b.rec.Sandbox.Runner = from
	b.mu.Unlock()
	m.failLocked(ctx, b, "upgrade: no guest could be started")
	return fmt.Errorf("%w: %v; no guest could be started again: %w", errUpgradeFailed, upErr, errdefs.ErrUnavailable)
}

// failLocked records b as failed (only resume and delete work then).
func (m *Manager) failLocked(ctx context.Context, b *box, detail string) {
	m.setStateAndSave(ctx, b, api.StateFailed, detail)
}

func (m *Manager) setStateAndSave(ctx context.Context, b *box, state, detail string) {
	b.mu.Lock()
	cur := b.rec.Sandbox.State
	b.mu.Unlock()
	if cur == state {
		if err := m.saveLocked(ctx, b); err != nil {
			m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", b.rec.Sandbox.ID, "err", err)
		}
		return
	}
	if err := m.transition(ctx, b, state, api.CauseError, detail); err != nil {
		m.log.ErrorContext(ctx, "saving sandbox record", "sandbox", b.rec.Sandbox.ID, "err", err)
	}
}

func clipVersion(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
