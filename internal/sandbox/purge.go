package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// PurgeTenant deletes what tenant owns besides sandboxes: what extensions
// keep for it (PurgeHook: its checkpoints, its secrets), then its templates
// (saved, built and imported, and registered specs), so that a later tenant of the same name starts
// with nothing. It fails with ErrConflict while the tenant still owns
// sandboxes (they run on its checkpoints and templates; delete them
// first). What could not be deleted is reported in the error and left
// for a repeated call; deleting nothing is no error. The admin tenant is
// not purged.
func (m *Manager) PurgeTenant(ctx context.Context, id string) error {
	id = tenant.Owner(id)
	if id == api.AdminTenant {
		return fmt.Errorf("the admin tenant is not purged: %w", errdefs.ErrInvalidArgument)
	}
	if n, _ := m.Holdings(id); n > 0 {
		return fmt.Errorf("tenant %s owns %d sandboxes; delete them first: %w", id, n, errdefs.ErrConflict)
	}
	ctx = context.WithoutCancel(ctx)
	as := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: id, Scope: api.ScopeFull})
	var errs []error
	// Extensions first: the checkpoint feature's checkpoints sit on the
	// tenant's templates' layers.
	for _, x := range m.hooks.purge {
		if err := x.h.OnPurgeTenant(as, id); err != nil {
			errs = append(errs, err)
		}
	}
	if m.templates != nil {
		for _, name := range m.templates.Names() {
			if owner, _ := tenant.Split(name); owner == id {
				if err := m.templates.Delete(ctx, name); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting what tenant %s owns: %w", id, err)
	}
	m.log.InfoContext(ctx, "tenant's checkpoints, templates and secrets deleted", "tenant", id)
	return nil
}
