package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// Per-sandbox host id ranges (Config.IDRanges). A sandbox's range is
// chosen when it is first started, recorded in its api.Sandbox (so a
// restarted daemon adopts it, and inspect reports it) and freed once the
// sandbox's processes and directory are gone. On disk every file stays in
// the canonical range Config.IDs: capturing, copying and diffing layers
// needs no ownership shift.

// idsOf is the host id range rec's sandbox runs in.
func (m *Manager) idsOf(rec store.SandboxRecord) runtime.IDMap {
	if r := rec.Sandbox.IDRange; r != nil {
		return runtime.IDMap{HostID: r.HostID, Size: r.Size}
	}
	return m.cfg.IDs
}

// allocIDs returns a range of its own for a new sandbox or build step to
// run on be: a prespawned guest's, when be has one ready (the Create with
// that range then uses the guest), else a fresh one. The caller owns the range
// and frees it with releaseIDs. Without Config.IDRanges it returns
// Config.IDs and ok false (nothing to free).
func (m *Manager) allocIDs(be runtime.Backend) (_ runtime.IDMap, ok bool, _ error) {
	if m.cfg.IDRanges == nil {
		return m.cfg.IDs, false, nil
	}
	if c, isClaimer := be.(runtime.IDRangeClaimer); isClaimer {
		if r, claimed := c.ClaimIDRange(); claimed {
			return r, true, nil
		}
	}
	r, err := m.cfg.IDRanges.Alloc()
	if err != nil {
		return runtime.IDMap{}, false, fmt.Errorf("allocating a host id range: %w", err)
	}
	return r, true, nil
}

// releaseIDs frees r (from allocIDs or a recovered record); call it only
// once the sandbox's processes and files are gone.
func (m *Manager) releaseIDs(r runtime.IDMap) {
	if m.cfg.IDRanges != nil && r != m.cfg.IDs {
		m.cfg.IDRanges.Release(r)
	}
}

// assignIDs gives rec, to run on be, a range of its own unless it has one.
// The returned undo frees it again (nil when nothing was assigned).
func (m *Manager) assignIDs(rec *store.SandboxRecord, be runtime.Backend) (undo func(), err error) {
	if rec.Sandbox.IDRange != nil {
		return nil, nil
	}
	r, ok, err := m.allocIDs(be)
	if err != nil || !ok {
		return nil, err
	}
	rec.Sandbox.IDRange = &api.IDRange{HostID: r.HostID, Size: r.Size}
	return func() {
		rec.Sandbox.IDRange = nil
		m.releaseIDs(r)
	}, nil
}

// adoptIDs marks a recovered record's range in use.
func (m *Manager) adoptIDs(ctx context.Context, rec store.SandboxRecord) {
	if m.cfg.IDRanges == nil || rec.Sandbox.IDRange == nil {
		return
	}
	if err := m.cfg.IDRanges.Adopt(m.idsOf(rec)); err != nil {
		m.log.WarnContext(ctx, "recovered sandbox's id range", "sandbox", rec.Sandbox.ID, "range", *rec.Sandbox.IDRange, "err", err)
	}
}
