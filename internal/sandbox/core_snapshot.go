package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// What the core offers features that read sandboxes' files on the host
// (internal/snapshot: diff, tree hash, merge). Every directory returned is
// a host path below the data dir, for root to read with lstat and
// O_NOFOLLOW (internal/layers), never to follow a link in.

// ReadFS returns the host directories of sandbox id's filesystem, top-most
// first (its writable upper directory, then its layers), with its
// operation lock held shared: no restore, checkpoint or delete changes
// them until release is called (its processes keep running, so a file
// being written shows in either state). It does not wake a sleeping
// sandbox and does not count as a call. The caller must call release,
// once. Another tenant's or an unknown sandbox is ErrNotFound.
func (m *Manager) ReadFS(ctx context.Context, id string) (dirs []string, release func(), err error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	b.life.RLock()
	b.mu.Lock()
	deleted, upper, lowers := b.deleted, b.rec.UpperDir, slices.Clone(b.rec.Layers)
	b.mu.Unlock()
	if deleted {
		b.life.RUnlock()
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return append([]string{upper}, lowers...), b.life.RUnlock, nil
}

// CheckpointDirs returns checkpoint ref (its id, else the newest
// checkpoint of that name the caller of ctx sees) and the host
// directories of its layer chain, top-most first. Checkpoints are
// immutable: the directories stay as they are while the checkpoint exists.
func (m *Manager) CheckpointDirs(ctx context.Context, ref string) (api.Checkpoint, []string, error) {
	rec, err := m.findCheckpointNamed(ctx, ref, nil)
	if err != nil {
		return api.Checkpoint{}, nil, err
	}
	dirs, err := m.cfg.Layers.Paths(rec.Layer)
	if err != nil {
		return api.Checkpoint{}, nil, fmt.Errorf("checkpoint %s: %w", rec.Checkpoint.ID, err)
	}
	rec.Checkpoint.DurationMS = 0
	return rec.Checkpoint, dirs, nil
}

// TemplateDirs resolves template name as a create would (the caller's
// own templates first, then the catalogue; a builtin is built on first
// use) and returns its full name and the host directories of its layers,
// top-most first.
func (m *Manager) TemplateDirs(ctx context.Context, name string) (string, []string, error) {
	t, err := m.template(ctx, name)
	if err != nil {
		return "", nil, err
	}
	return t.Name, t.Layers, nil
}

// ForkBase is the id of the checkpoint the sandbox was forked from ("" for
// a sandbox that is no fork): the common ancestor of a merge with its
// parent or a sibling.
func (h *Handle) ForkBase() string {
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	return extraOf(h.b.rec).ForkBase
}

// Report shows op, an operation a feature carried out (a merge), to
// every Observer, as the core's own operations are; an empty op.Tenant is
// filled in from op.Sandbox. It follows Observer's rules: synchronous, in
// order, never failing.
func (m *Manager) Report(ctx context.Context, op Op) {
	if len(m.hooks.observers) == 0 {
		return
	}
	if op.Sandbox != "" && op.Tenant == "" {
		m.mu.Lock()
		b := m.sandboxes[op.Sandbox]
		m.mu.Unlock()
		if b != nil {
			op.Tenant = b.owner()
		}
	}
	m.observe(ctx, op)
}
