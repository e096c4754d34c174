package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// Recover re-adopts the sandboxes an earlier daemon left running and reaps
// the rest. It must run once, before requests are served. A sandbox whose
// guest still runs is registered again with its guest untouched (its
// processes never noticed the restart); one whose guest died, or whose
// record is broken, is cleaned up completely; sandbox directories with no
// record (a crash mid-create) are removed. A sandbox whose record names a
// backend this daemon does not run is left as it is, for a daemon that
// runs it (its record, directory and id range are kept; it is not
// served). Corrupt records are quarantined first; last, host resources
// under ids nobody knows are swept.
func (m *Manager) Recover(ctx context.Context) error {
	m.quarantineCorrupt(ctx)
	recs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("recovering sandboxes: %w", err)
	}
	known := make(map[string]bool, len(recs))
	foreign := map[string]bool{}
	adopted, reaped := 0, 0
	// Every recorded range is taken before anything is reaped or created.
	for _, rec := range recs {
		m.adoptIDs(ctx, rec)
	}
	for _, rec := range recs {
		id := rec.Sandbox.ID
		known[id] = true
		if _, err := m.backendOf(rec); err != nil {
			m.log.WarnContext(ctx, "sandbox of a backend this daemon does not run; left as it is", "sandbox", id, "err", err)
			foreign[id] = true
			continue
		}
		if err := m.adopt(ctx, rec); err != nil {
			if m.keepCold(ctx, rec, err) {
				adopted++
				continue
			}
			m.log.WarnContext(ctx, "sandbox not recoverable; cleaning up", "sandbox", id, "err", err)
			if cerr := m.reap(ctx, rec); cerr != nil {
				m.log.ErrorContext(ctx, "cleaning up sandbox", "sandbox", id, "err", cerr)
			}
			reaped++
			continue
		}
		adopted++
	}
	entries, err := os.ReadDir(filepath.Join(m.cfg.DataDir, "sandboxes"))
	if err != nil {
		return fmt.Errorf("recovering sandboxes: %w", err)
	}
	for _, e := range entries {
		if known[e.Name()] || !idRE.MatchString(e.Name()) {
			continue
		}
		m.log.WarnContext(ctx, "removing orphaned sandbox", "sandbox", e.Name())
		p := m.paths(e.Name())
		rec := store.SandboxRecord{Sandbox: api.Sandbox{ID: e.Name()}, UpperDir: p.upper, WorkDir: p.work, StateDir: p.state, SocketPath: p.socket}
		if err := m.reap(ctx, rec); err != nil {
			m.log.ErrorContext(ctx, "removing orphaned sandbox", "sandbox", e.Name(), "err", err)
		}
		reaped++
	}
	m.removeOrphanDisks(ctx, known)
	m.recoverLayers(ctx)
	m.reapHidden(ctx)
	m.sweepOrphans(ctx, foreign)
	m.log.InfoContext(ctx, "sandboxes recovered", "adopted", adopted, "reaped", reaped, "foreign", len(foreign))
	return nil
}

func (m *Manager) adopt(ctx context.Context, rec store.SandboxRecord) error {
	switch rec.Sandbox.State {
	case api.StateRunning:
	case api.StatePaused, api.StateHibernated:
		return m.adoptAsleep(ctx, rec)
	default:
		return fmt.Errorf("recorded state %q: %w", rec.Sandbox.State, errdefs.ErrNotFound)
	}
	be, err := m.backendOf(rec)
	if err != nil {
		return err
	}
	rt, err := be.Recover(ctx, m.runtimeSpec(rec), rec.RuntimeState)
	if err != nil {
		return err
	}
	// A daemon that died mid-checkpoint may have left it frozen.
	if p, ok := rt.(runtime.Pauser); ok {
		if err := p.Resume(ctx); err != nil {
			_ = rt.Destroy(context.WithoutCancel(ctx))
			return fmt.Errorf("thawing: %w", err)
		}
	}
	guest := client.New(rt.SocketPath())
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	version, err := guest.Version(vctx)
	cancel()
	if err != nil {
		_ = rt.Destroy(context.WithoutCancel(ctx))
		return fmt.Errorf("guest does not answer: %w", err)
	}
	rec.Sandbox.GuestVersion = version
	rec.RuntimeState = rt.State()
	b := &box{guest: guest, rec: rec, rt: rt}
	// An expired sandbox is registered too: register's expiry timer fires
	// at once and deletes it through the ordinary path.
	if err := m.register(b); err != nil {
		return err
	}
	m.onRecover(ctx, b)
	return nil
}

// reap removes every trace of a sandbox that is not running.
func (m *Manager) reap(ctx context.Context, rec store.SandboxRecord) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if err := m.cleanupRuntime(ctx, rec); err != nil {
		// Keep the directory: it is how the next start finds what is
		// left of this sandbox and tries again.
		return err
	}
	if err := m.removeDisk(ctx, rec.Sandbox.ID); err != nil {
		return err
	}
	if err := os.RemoveAll(m.paths(rec.Sandbox.ID).dir); err != nil {
		errs = append(errs, err)
	} else {
		m.releaseIDs(m.idsOf(rec))
	}
	if err := m.store.DeleteSandbox(ctx, rec.Sandbox.ID); err != nil {
		errs = append(errs, err)
	}
	m.releaseLayers(ctx, rec.Sandbox.ID)
	return errors.Join(errs...)
}
