package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Tenancy. Every sandbox records its tenant (api.Sandbox.Tenant); get is
// the one place a call naming a sandbox is checked against the caller
// (tenant.From(ctx)), and lists are filtered the same way. Checkpoints
// belong to their sandbox's tenant. Templates and secrets are named per
// tenant (tenant.Qualify). New sandboxes and runs are admitted against
// their tenant's quotas.

// Quotas admits new sandboxes, layers and runs against their tenant's
// quotas (internal/tenant/registry.Registry). Every method is safe for concurrent
// use and fails with errdefs.ErrResourceExhausted (carrying a retry hint)
// when over.
type Quotas interface {
	// AdmitSandboxes reserves room for n sandboxes asking for disk bytes
	// each (0: none asked) and returns the disk limit each must get;
	// release is called once they exist or have failed.
	AdmitSandboxes(ctx context.Context, tenant string, n int, disk int64) (diskEach int64, release func(), err error)
	// AdmitLayer reserves room in the tenant's disk quota for layer, just
	// written for a checkpoint or template of the tenant and not recorded
	// yet; release is called once its record is written (layergc.LayerBytes
	// then counts it) or the layer was dropped. When it fails, the caller drops
	// the layer and records nothing.
	AdmitLayer(ctx context.Context, tenant, layer string) (release func(), err error)
	// AdmitRun checks the tenant's CPU quota.
	AdmitRun(ctx context.Context, tenant string) error
}

// quotaAdmission is Config.Quotas (nil: nothing is limited).
func (m *Manager) quotaAdmission() Quotas { return m.cfg.Quotas }

func (m *Manager) admitSandboxes(ctx context.Context, owner string, n int, disk int64) (int64, func(), error) {
	q := m.quotaAdmission()
	if q == nil {
		return disk, func() {}, nil
	}
	return q.AdmitSandboxes(ctx, tenant.Owner(owner), n, disk)
}

func (m *Manager) admitRun(ctx context.Context, owner string) error {
	q := m.quotaAdmission()
	if q == nil {
		return nil
	}
	return q.AdmitRun(ctx, tenant.Owner(owner))
}

// Holdings returns the number of owner's sandboxes (every state; pooled
// ones belong to nobody yet) and the sum of their disk limits: the
// figures its sandbox and disk quotas count.
func (m *Manager) Holdings(owner string) (sandboxes int, diskBytes int64) {
	owner = tenant.Owner(owner)
	m.mu.Lock()
	boxes := make([]*box, 0, len(m.sandboxes))
	for _, b := range m.sandboxes {
		boxes = append(boxes, b)
	}
	m.mu.Unlock()
	for _, b := range boxes {
		b.mu.Lock()
		if !b.deleted && b.hidden == "" && tenant.Owner(b.rec.Sandbox.Tenant) == owner {
			sandboxes++
			diskBytes += b.rec.Sandbox.Resources.DiskBytes
		}
		b.mu.Unlock()
	}
	return sandboxes, diskBytes
}

// admitExec checks the CPU quota of the tenant owning sandbox id (which
// pays for what runs in it) before a process starts, without waking the
// sandbox.
func (m *Manager) admitExec(ctx context.Context, id string) error {
	b, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	if err := m.admitRun(ctx, b.owner()); err != nil {
		return fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	return nil
}

// DefaultTenant is the tenant of runs of no other tenant.
const DefaultTenant = api.AdminTenant
