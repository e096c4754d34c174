package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The layers a sandbox runs on, its writable upper directory, and the
// exclusive lock checkpoints, restore, fork and template saves take. The
// checkpoint feature itself (records, restore, fork, exec transactions)
// is internal/snapshot; it reaches these through core_snapshot.go.
//
// Every sandbox that runs on a layer no template holds (a checkpoint's:
// forked or restored) holds a reference on its top layer (LayerOwner:
// "sandbox/<id>"), dropped when the sandbox is deleted. Sandboxes created
// from a template rely on the template's reference.

func sandboxRef(id string) string { return "sandbox/" + id }

// lockRunning takes the sandbox's lifecycle lock exclusively and checks
// that it is running, waking it first when it is paused or hibernated; the
// caller calls unlock.
func (m *Manager) lockRunning(ctx context.Context, id string) (b *box, unlock func(), err error) {
	b, err = m.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if err := m.wakeIfAsleep(b, "checkpoint"); err != nil {
		return nil, nil, err
	}
	b.life.Lock()
	b.mu.Lock()
	state, deleted := b.rec.Sandbox.State, b.deleted
	b.mu.Unlock()
	switch {
	case deleted:
		b.life.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	case state != api.StateRunning:
		b.life.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s is %s: %w", id, state, errdefs.ErrConflict)
	}
	return b, b.life.Unlock, nil
}

// freshUpper replaces the sandbox's upper and work dirs by empty ones owned
// by the mapped root and returns the directory holding the old ones (for
// the caller to remove; Recover removes leftovers).
func (m *Manager) freshUpper(id string) (string, error) {
	p := m.paths(id)
	trash, err := os.MkdirTemp(p.dir, trashPrefix)
	if err != nil {
		return "", err
	}
	for _, d := range []string{p.upper, p.work} {
		if err := os.Rename(d, filepath.Join(trash, filepath.Base(d))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return trash, err
		}
	}
	if err := m.mkUpperWork(p); err != nil {
		return trash, err
	}
	return trash, nil
}

// trashPrefix names directories of replaced upper dirs inside a sandbox dir.
const trashPrefix = ".old-"

func (m *Manager) mkUpperWork(p sandboxPaths) error {
	for _, d := range []string{p.upper, p.work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := os.Lchown(d, int(m.cfg.IDs.HostID), int(m.cfg.IDs.HostID)); err != nil {
			return err
		}
	}
	return nil
}

// releaseLayers drops every layer reference of sandbox id.
func (m *Manager) releaseLayers(ctx context.Context, id string) {
	if m.cfg.Layers == nil {
		return
	}
	owner := sandboxRef(id)
	for _, l := range m.cfg.Layers.List() {
		if slices.Contains(l.Refs, owner) {
			if err := m.cfg.Layers.Unref(ctx, l.ID, owner); err != nil {
				m.log.WarnContext(ctx, "releasing layer", "layer", l.ID, "sandbox", id, "err", err)
			}
		}
	}
}

// recoverLayers runs at start-up, after the sandboxes are recovered:
// references of sandboxes that no longer exist are dropped and leftovers of
// replaced upper dirs are removed.
func (m *Manager) recoverLayers(ctx context.Context) {
	if m.cfg.Layers == nil {
		return
	}
	m.mu.Lock()
	live := make(map[string]bool, len(m.sandboxes))
	for id := range m.sandboxes {
		live[id] = true
	}
	m.mu.Unlock()
	for _, l := range m.cfg.Layers.List() {
		for _, r := range l.Refs {
			if id, ok := strings.CutPrefix(r, "sandbox/"); ok && !live[id] {
				_ = m.cfg.Layers.Unref(ctx, l.ID, r)
			}
		}
	}
	for id := range live {
		old, _ := filepath.Glob(filepath.Join(m.paths(id).dir, trashPrefix+"*"))
		for _, d := range old {
			_ = os.RemoveAll(d)
		}
	}
}
