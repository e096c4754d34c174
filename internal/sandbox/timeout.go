package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// SetTimeout makes sandbox id's hard lifetime (CreateSandboxRequest's
// TimeoutSeconds) end d from now, replacing the one it had (or giving
// one to a sandbox that had none). Time asleep does not count against it
// unless the sandbox's idle policy says TTLCountsAsleep: a paused or
// hibernated sandbox keeps d to run once woken. d must be positive
// (ErrInvalidArgument). It takes the sandbox's lifecycle lock
// exclusively, does not wake the sandbox and persists the record; the
// sandbox is returned as it then is. Calling it again simply moves the
// end again.
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	if d <= 0 {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: timeout %s: want a positive duration: %w", id, d, errdefs.ErrInvalidArgument)
	}
	b, unlock, err := m.lockLive(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	b.mu.Lock()
	sb := &b.rec.Sandbox
	countsAsleep := sb.Idle != nil && sb.Idle.TTLCountsAsleep
	if asleep(sb.State) && !countsAsleep {
		b.rec.TTLLeft = d
		sb.ExpiresAt = nil
	} else {
		exp := m.cfg.Clock.Now().UTC().Add(d)
		sb.ExpiresAt = &exp
		b.rec.TTLLeft = 0
	}
	m.scheduleTTLLocked(b)
	b.mu.Unlock()
	if err := m.saveLocked(ctx, b); err != nil {
		return api.Sandbox{}, err
	}
	return b.view(), nil
}
