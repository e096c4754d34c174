package registry

import (
	"context"
	"fmt"
	"sync"

	"github.com/agentbox/agentbox/internal/tenant"
)

// The disk quota. A tenant's disk in use is the sum of the disk limits of
// its sandboxes (reserved whole when they are created) plus the bytes on
// disk of the layers it holds: those in the chains of its checkpoints and
// of its templates (Meters.Layers). A layer held by several owners is
// charged in full to every tenant whose chains contain it, once per tenant
// however many of its chains share it; so a tenant can never stay under
// its quota by stacking on another's layers, and deleting its own
// checkpoints and templates always frees what they alone held. Layers of
// the shared catalogue (the admin's templates) are charged to nobody.
//
// A layer's size is known only once it is written, so a new one (a
// checkpoint, a saved template version, a built or imported template) is
// written first and then admitted or undone: AdmitLayer. Admissions of one
// tenant's disk (sandboxes and layers) are serialised by a lock of that
// tenant's, under which the layers are metered and the new one reserved;
// a reserved layer stays counted until release, which the caller calls
// once the layer's record is written (and the meter counts it) or the
// layer was dropped. So concurrent checkpoints cannot overshoot together.

// layerHold is one admitted layer not yet released.
type layerHold struct{ id string }

// lockDisk takes tenant's disk admission lock when it has a disk quota and
// layers are metered, and returns its unlock; nil when neither applies
// (nothing to serialise). The caller must not hold r.mu.
func (r *Registry) lockDisk(tenant string) (unlock func()) {
	r.mu.Lock()
	t, ok := r.tenants[tenant]
	if !ok || t.Quotas.DiskBytes == 0 || r.quota.meters.Layers == nil || r.quota.meters.Holdings == nil {
		r.mu.Unlock()
		return nil
	}
	if r.quota.disk == nil {
		r.quota.disk = map[string]*sync.Mutex{}
	}
	mu := r.quota.disk[tenant]
	if mu == nil {
		mu = &sync.Mutex{}
		r.quota.disk[tenant] = mu
	}
	r.mu.Unlock()
	mu.Lock()
	return mu.Unlock
}

// layerBytes meters the layers charged to tenant, those reserved and not
// yet released and extra ("": none) included. The reservations are read
// before the meter, so that a layer released meanwhile (which its record
// counts before it is released) is seen by one or the other; with
// tenant's disk lock held no reservation is added meanwhile. The caller
// must not hold r.mu.
func (r *Registry) layerBytes(ctx context.Context, tenant, extra string) (int64, error) {
	r.mu.Lock()
	meter := r.quota.meters.Layers
	var ids []string
	for h := range r.quota.layers[tenant] {
		ids = append(ids, h.id)
	}
	r.mu.Unlock()
	if meter == nil {
		return 0, nil
	}
	if extra != "" {
		ids = append(ids, extra)
	}
	n, err := meter(ctx, tenant, ids)
	if err != nil {
		return 0, fmt.Errorf("metering the layers of tenant %s: %w", tenant, err)
	}
	return n, nil
}

// AdmitLayer admits layer, written for tenant and not yet recorded (the
// layer of a new checkpoint, saved template version, built or imported
// template), against tenant's disk quota: the disk limits of its sandboxes
// plus its layers with this one (see above) must not exceed it. On success
// the layer is reserved until release, which the caller must call once the
// layer's record exists (is counted by Meters.Layers) or the layer has
// been dropped; calling it again is a no-op. Over the quota it fails with
// ErrResourceExhausted carrying a retry hint, and the caller must undo the
// layer. The admin, tenants without a disk quota and unknown tenants are
// always admitted.
func (r *Registry) AdmitLayer(ctx context.Context, tenant, layer string) (release func(), err error) {
	noop := func() {}
	if ownedByAdmin(tenant) {
		return noop, nil
	}
	unlock := r.lockDisk(tenant)
	if unlock == nil {
		r.mu.Lock()
		t, ok := r.tenants[tenant]
		unmetered := ok && t.Quotas.DiskBytes > 0 && r.quota.meters.Holdings == nil
		r.mu.Unlock()
		if unmetered {
			return nil, errNotMetered(tenant)
		}
		return noop, nil
	}
	defer unlock()
	layerBytes, err := r.layerBytes(ctx, tenant, layer)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[tenant]
	if !ok || t.Quotas.DiskBytes == 0 {
		return noop, nil
	}
	if r.quota.meters.Holdings == nil {
		return nil, errNotMetered(tenant)
	}
	_, heldDisk := r.quota.meters.Holdings(tenant)
	if res := r.quota.pending[tenant]; res != nil {
		heldDisk += res.disk
	}
	if used := heldDisk + layerBytes; used > t.Quotas.DiskBytes {
		return nil, exhausted(tenant, fmt.Sprintf("disk (%d of %d bytes with this layer: %d for sandboxes, %d for checkpoints and templates)",
			used, t.Quotas.DiskBytes, heldDisk, layerBytes), holdRetry)
	}
	if r.quota.layers == nil {
		r.quota.layers = map[string]map[*layerHold]struct{}{}
	}
	set := r.quota.layers[tenant]
	if set == nil {
		set = map[*layerHold]struct{}{}
		r.quota.layers[tenant] = set
	}
	h := &layerHold{id: layer}
	set[h] = struct{}{}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(set, h) // set stays in r.quota.layers: one small map per tenant
	}, nil
}

// AdmitTemplateLayer is AdmitLayer for a layer that template name (its
// stored name, which carries the owning tenant: tenant.Qualify) takes:
// it is charged to the template's tenant. It is the template store's
// admission (templates.Config.Admit).
func (r *Registry) AdmitTemplateLayer(ctx context.Context, name, layer string) (release func(), err error) {
	owner, _ := tenant.Split(name)
	return r.AdmitLayer(ctx, tenant.Owner(owner), layer)
}
