package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// CreateSandbox creates and starts a sandbox; see CreateOrGetSandbox.
func (m *Manager) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	sb, _, err := m.CreateOrGetSandbox(ctx, req)
	return sb, err
}

// CreateOrGetSandbox creates and starts a sandbox from a template with the
// lifecycle preset and idle policy req asks for. When req names a
// sandbox that exists (names are unique among live sandboxes), that one is
// returned instead, woken (restarted if its guest had stopped), and created
// is false; a different explicit template is ErrConflict. It returns once
// the sandbox's guest answers. On error nothing of a new sandbox is left
// behind.
func (m *Manager) CreateOrGetSandbox(ctx context.Context, req api.CreateSandboxRequest) (_ api.Sandbox, created bool, _ error) {
	explicitRuntime := req.Runtime
	if _, err := m.resolveRuntime(&req); err != nil {
		return api.Sandbox{}, false, fmt.Errorf("creating sandbox: %w", err)
	}
	if err := m.resolveLifecycle(&req); err != nil {
		return api.Sandbox{}, false, fmt.Errorf("creating sandbox: %w", err)
	}
	if req.Name == "" {
		sb, err := m.createSandbox(ctx, req)
		return sb, err == nil, err
	}
	m.lc.nameMu.Lock()
	defer m.lc.nameMu.Unlock()
	b := m.byName(tenant.From(ctx).Tenant, req.Name)
	if b == nil {
		sb, err := m.createSandbox(ctx, req)
		return sb, err == nil, err
	}
	sb := b.view()
	if req.Template != "" && req.Template != sb.Template {
		return api.Sandbox{}, false, fmt.Errorf("sandbox %q exists with template %s, not %s: %w", req.Name, sb.Template, req.Template, errdefs.ErrConflict)
	}
	if explicitRuntime != "" && req.Runtime != sb.Backend {
		return api.Sandbox{}, false, fmt.Errorf("sandbox %q exists on runtime %s, not %s: %w", req.Name, sb.Backend, req.Runtime, errdefs.ErrConflict)
	}
	b.life.Lock()
	err := m.wakeLocked(ctx, b, api.CauseWake, "create by name", true)
	b.life.Unlock()
	if err != nil {
		return api.Sandbox{}, false, err
	}
	m.log.InfoContext(ctx, "sandbox reused by name", "sandbox", sb.ID, "name", req.Name)
	return b.view(), false, nil
}

// byName returns owner's live sandbox named name, or nil. Names are
// unique per tenant: two tenants may each have a sandbox "dev".
func (m *Manager) byName(owner, name string) *box {
	owner = tenant.Owner(owner)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.sandboxes {
		b.mu.Lock()
		match := !b.deleted && b.rec.Sandbox.Name == name && tenant.Owner(b.rec.Sandbox.Tenant) == owner
		b.mu.Unlock()
		if match {
			return b
		}
	}
	return nil
}

// adoptAsleep re-adopts a paused or hibernated sandbox at start-up. A
// paused one stays frozen (its guest is checked to be the same process in
// its cgroup, not pinged: it cannot answer); a hibernated one has nothing
// to adopt and wakes on its first use.
func (m *Manager) adoptAsleep(ctx context.Context, rec store.SandboxRecord) error {
	b := &box{rec: rec}
	if rec.Sandbox.State == api.StatePaused {
		be, err := m.backendOf(rec)
		if err != nil {
			return err
		}
		rt, err := be.Recover(ctx, m.runtimeSpec(rec), rec.RuntimeState)
		if err != nil {
			return err
		}
		// A daemon that died mid-pause may have left it thawed.
		if p, ok := rt.(runtime.Pauser); ok {
			if err := p.Pause(ctx); err != nil {
				_ = rt.Destroy(context.WithoutCancel(ctx))
				return fmt.Errorf("freezing: %w", err)
			}
		}
		b.rt, b.guest = rt, client.New(rt.SocketPath())
		b.rec.RuntimeState = rt.State()
	}
	if err := m.register(b); err != nil {
		return err
	}
	m.onRecover(ctx, b)
	return nil
}

// keepCold keeps a persistent sandbox whose guest is gone (a host reboot,
// a crash mid-hibernate) as hibernated instead of reaping it: its
// filesystem is what a persistent sandbox promises to keep. It reports
// whether it did.
func (m *Manager) keepCold(ctx context.Context, rec store.SandboxRecord, why error) bool {
	if rec.Sandbox.Lifecycle != api.LifecyclePersistent {
		return false
	}
	switch rec.Sandbox.State {
	case api.StateRunning, api.StatePaused, api.StateStopped, api.StateHibernated:
	default:
		return false
	}
	id := rec.Sandbox.ID
	if err := m.cleanupRuntime(ctx, rec); err != nil {
		m.log.WarnContext(ctx, "cleaning up after a lost guest", "sandbox", id, "err", err)
		return false
	}
	b := &box{rec: rec}
	b.rec.RuntimeState = nil
	if rec.Sandbox.State != api.StateHibernated {
		m.setStateLocked(b, api.StateHibernated, api.CauseRecover, "guest gone at daemon start")
	}
	if err := m.saveLocked(ctx, b); err != nil {
		m.log.WarnContext(ctx, "keeping persistent sandbox", "sandbox", id, "err", err)
		return false
	}
	if err := m.register(b); err != nil {
		return false
	}
	m.onRecover(ctx, b)
	m.log.WarnContext(ctx, "persistent sandbox's guest is gone; kept hibernated", "sandbox", id, "err", why)
	return true
}
