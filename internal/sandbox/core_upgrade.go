package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runner"
)

// What the core offers the runner upgrade feature (internal/upgrade): the
// swap of a sandbox's guest onto another runner, which is a sequence of
// guest stops and starts under the sandbox's lock (upgrade.go).

// UpgradeGuest moves sandbox id's guest onto rn, a runner the caller has
// validated (runner.Store.Open, Stage or StageFile). With the sandbox's
// lock held exclusively it wakes a paused or hibernated sandbox, restarts
// the guest on rn (StartHook.OnStart runs with cause StartUpgrade) and
// checks it reports rn's build, then pauses or hibernates it again. On
// failure it falls back to the previous runner, the daemon's own, then a
// RescueHook (the latest checkpoint), and the error says what the sandbox
// runs now; when nothing starts the sandbox is failed. A sandbox already
// on rn is left alone (Changed false). It runs to its end even when ctx
// is cancelled once the swap began. The caller reports the operation to
// observers (Report, OpUpgrade).
func (m *Manager) UpgradeGuest(ctx context.Context, id string, rn runner.Runner) (api.UpgradeResult, error) {
	b, unlock, err := m.lockLive(ctx, id)
	if err != nil {
		return api.UpgradeResult{}, err
	}
	defer unlock()
	start := time.Now()
	res, err := m.upgradeLocked(ctx, b, rn)
	if err != nil {
		return api.UpgradeResult{}, fmt.Errorf("upgrading sandbox %s: %w", id, err)
	}
	res.DurationMS = time.Since(start).Milliseconds()
	res.Sandbox = b.view()
	if res.Changed {
		m.log.InfoContext(ctx, "sandbox upgraded", "sandbox", id, "from", res.FromVersion, "to", res.ToVersion, "ms", res.DurationMS)
	}
	return res, nil
}
