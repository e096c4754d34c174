package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/store"
)

// quarantineCorrupt sets corrupt store records aside before recovery reads
// the store, when the store can (store.Quarantiner). Their sandbox
// directories, having no record left, are then reaped like those of a crash
// mid-create.
func (m *Manager) quarantineCorrupt(ctx context.Context) {
	q, ok := m.store.(store.Quarantiner)
	if !ok {
		return
	}
	moved, err := q.QuarantineCorrupt(ctx)
	if err != nil {
		m.log.ErrorContext(ctx, "quarantining corrupt records", "err", err)
		return
	}
	if len(moved) > 0 {
		m.log.WarnContext(ctx, "corrupt records quarantined", "count", len(moved))
	}
}

// sweepOrphans runs at the end of Recover, once every record has been
// adopted or reaped: what is left on the host under a sandbox id the
// manager does not know (cgroups of every runtime.Sweeper backend, guest
// sockets) belongs to nothing and is removed. The ids of foreign are known
// too: sandboxes of backends this daemon does not run, left as they are.
func (m *Manager) sweepOrphans(ctx context.Context, foreign map[string]bool) {
	m.mu.Lock()
	live := make(map[string]bool, len(m.sandboxes))
	for id := range m.sandboxes {
		live[id] = true
	}
	m.mu.Unlock()
	keep := func(id string) bool { return live[id] || foreign[id] }
	swept, err := m.backends.SweepOrphans(ctx, keep)
	if err != nil {
		m.log.ErrorContext(ctx, "sweeping orphaned sandbox resources", "err", err)
	}
	if len(swept) > 0 {
		m.log.WarnContext(ctx, "orphaned sandbox resources removed", "ids", swept)
	}
	socks, _ := filepath.Glob(filepath.Join(m.cfg.RunDir, "sb", "*.sock"))
	for _, s := range socks {
		id := strings.TrimSuffix(filepath.Base(s), ".sock")
		if !idRE.MatchString(id) || keep(id) {
			continue
		}
		if err := os.Remove(s); err == nil {
			m.log.WarnContext(ctx, "removed orphaned guest socket", "path", s)
		}
	}
}
