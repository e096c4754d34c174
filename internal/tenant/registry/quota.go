package registry

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Quotas. Holdings (sandboxes, their disk, and the layers of checkpoints
// and templates) are admitted with a reservation, so concurrent admissions
// cannot overshoot together: a create reserves its share under the
// registry lock and releases it once the sandbox is counted by the
// holdings meter (or has failed); a layer is reserved likewise until its
// record counts it (disk.go). CPU is metered after the fact from run
// records, so a run that starts within quota may end beyond it; later
// creates and execs then get 429 until the period ends.

// holdRetry is the Retry-After of sandbox and disk quotas: the caller must
// delete something first, there is no time at which it frees itself.
const holdRetry = 10 * time.Second

// cpuCacheTTL bounds how stale the CPU figure a run is admitted on may be.
const cpuCacheTTL = time.Second

// Meters are where quota usage comes from; all must be safe for
// concurrent use.
type Meters struct {
	// Holdings returns the number of tenant's sandboxes (every state but
	// deleted) and the sum of their disk limits.
	Holdings func(tenant string) (sandboxes int, diskBytes int64)
	// Layers returns the bytes on disk of the layers charged to tenant:
	// every layer in the chains of its checkpoints and of its templates'
	// layers (saved versions, built and imported templates), and in the
	// chains of extra (layers admitted but not recorded yet), each layer
	// counted once, the shared catalogue's (the admin's templates) not at
	// all. It is called without the registry lock held and may be slow
	// (it reads records). nil: layers count against no quota.
	Layers func(ctx context.Context, tenant string, extra []string) (int64, error)
	// CPUSeconds returns the CPU seconds of tenant's runs started at or
	// after since.
	CPUSeconds func(ctx context.Context, tenant string, since time.Time) (float64, error)
}

// quotaState is guarded by Registry.mu.
type quotaState struct {
	meters  Meters
	pending map[string]*reservation
	cpu     map[string]cpuSample
	// layers holds, per tenant, the layers admitted and not yet released
	// (disk.go).
	layers map[string]map[*layerHold]struct{}
	// disk holds, per tenant with a disk quota, the lock that serialises
	// its disk admissions (disk.go). Taken before Registry.mu, never
	// while holding it.
	disk map[string]*sync.Mutex
}

type reservation struct {
	sandboxes int
	disk      int64
}

type cpuSample struct {
	at, since time.Time
	seconds   float64
}

// SetMeters connects the quota meters. Call it before anything is
// admitted: until it is, the admission of a tenant that has a quota fails
// closed (ErrUnavailable) rather than letting it past an unmetered quota.
func (r *Registry) SetMeters(m Meters) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quota.meters = m
}

// periodOf returns the CPU period around now, aligned to the Unix epoch as
// api.Quotas documents. (time.Time.Truncate aligns to year 1, which agrees
// only for periods that divide 62135596800 s: an hour or a day, not a week
// or 1000 s.)
func periodOf(q api.Quotas, now time.Time) (start, end time.Time) {
	p := q.PeriodSeconds
	if p <= 0 {
		p = api.DefaultQuotaPeriodSeconds
	}
	u := now.Unix()
	start = time.Unix(u-((u%p)+p)%p, 0)
	return start, start.Add(time.Duration(p) * time.Second)
}

// errNotMetered refuses an admission asked before the meters are
// connected (SetMeters): a quota that cannot be measured admits nothing.
func errNotMetered(tenant string) error {
	return fmt.Errorf("tenant %s: quota meters are not connected yet: %w", tenant, errdefs.ErrUnavailable)
}

func exhausted(tenant, what string, after time.Duration) error {
	return errdefs.WithRetryAfter(fmt.Errorf("tenant %s is over its %s quota: %w", tenant, what, errdefs.ErrResourceExhausted), after)
}

// AdmitSandboxes reserves room for n new sandboxes of tenant, each asking
// for a disk limit of disk bytes (0: none asked). It returns the disk limit
// each must get — when the tenant has a disk quota and none was asked,
// api.DefaultTenantDiskBytes or what is left of the quota split evenly —
// and release, which the caller must call once the sandboxes exist (are
// counted by the holdings meter) or have failed. The disk quota counts the
// layers of the tenant's checkpoints and templates too (see AdmitLayer).
// Over quota it fails with ErrResourceExhausted carrying a retry hint
// (errdefs.RetryAfter).
func (r *Registry) AdmitSandboxes(ctx context.Context, tenant string, n int, disk int64) (diskEach int64, release func(), err error) {
	noop := func() {}
	if ownedByAdmin(tenant) || n <= 0 {
		return disk, noop, nil
	}
	if err := r.AdmitRun(ctx, tenant); err != nil {
		return 0, nil, err
	}
	// With a disk quota, the layers held count too: measured under the
	// tenant's disk lock, before the registry lock (see layerBytes).
	var layerBytes int64
	if unlock := r.lockDisk(tenant); unlock != nil {
		defer unlock()
		if layerBytes, err = r.layerBytes(ctx, tenant, ""); err != nil {
			return 0, nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[tenant]
	if !ok {
		return disk, noop, nil
	}
	q := t.Quotas
	if q.MaxSandboxes == 0 && q.DiskBytes == 0 {
		return disk, noop, nil
	}
	if r.quota.meters.Holdings == nil {
		return 0, nil, errNotMetered(tenant)
	}
	held, heldDisk := r.quota.meters.Holdings(tenant)
	res := r.quota.pending[tenant]
	if res == nil {
		res = &reservation{}
		r.quota.pending[tenant] = res
	}
	held += res.sandboxes
	heldDisk += res.disk + layerBytes
	// Compared so that a huge n or disk cannot overflow past the quota.
	if q.MaxSandboxes > 0 && n > q.MaxSandboxes-held {
		return 0, nil, exhausted(tenant, fmt.Sprintf("sandboxes (%d of %d in use, %d asked)", held, q.MaxSandboxes, n), holdRetry)
	}
	if q.DiskBytes > 0 {
		left := q.DiskBytes - heldDisk
		if disk == 0 {
			disk = min(int64(api.DefaultTenantDiskBytes), left/int64(n))
		}
		if disk <= 0 || disk > left/int64(n) {
			return 0, nil, exhausted(tenant, fmt.Sprintf("disk (%d of %d bytes allocated, %d of them by checkpoints and templates)", heldDisk, q.DiskBytes, layerBytes), holdRetry)
		}
	}
	res.sandboxes += n
	res.disk += disk * int64(n)
	released := false
	return disk, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if released {
			return
		}
		released = true
		res.sandboxes -= n
		res.disk -= disk * int64(n)
	}, nil
}

// AdmitRun checks tenant's CPU quota for the current period; over it, it
// fails with ErrResourceExhausted and a retry hint of the period's end.
func (r *Registry) AdmitRun(ctx context.Context, tenant string) error {
	if ownedByAdmin(tenant) {
		return nil
	}
	r.mu.Lock()
	t, ok := r.tenants[tenant]
	cpuMeter := r.quota.meters.CPUSeconds
	r.mu.Unlock()
	if !ok || t.Quotas.CPUSeconds == 0 {
		return nil
	}
	if cpuMeter == nil {
		return errNotMetered(tenant)
	}
	now := r.now()
	start, end := periodOf(t.Quotas, now)
	used, err := r.cpuUsed(ctx, tenant, start, now, cpuMeter)
	if err != nil {
		return fmt.Errorf("metering tenant %s: %w", tenant, err)
	}
	if used >= t.Quotas.CPUSeconds {
		return exhausted(tenant, fmt.Sprintf("CPU (%.1f of %.1f CPU-seconds this period)", used, t.Quotas.CPUSeconds), end.Sub(now))
	}
	return nil
}

func (r *Registry) cpuUsed(ctx context.Context, tenant string, start, now time.Time, meter func(context.Context, string, time.Time) (float64, error)) (float64, error) {
	r.mu.Lock()
	s, ok := r.quota.cpu[tenant]
	r.mu.Unlock()
	if ok && s.since.Equal(start) && now.Sub(s.at) < cpuCacheTTL {
		return s.seconds, nil
	}
	used, err := meter(ctx, tenant, start)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	if r.quota.cpu == nil {
		r.quota.cpu = map[string]cpuSample{}
	}
	r.quota.cpu[tenant] = cpuSample{at: now, since: start, seconds: used}
	r.mu.Unlock()
	return used, nil
}

// Usage returns what counts against tenant t's quotas now. DiskBytes is
// the disk limits of its sandboxes plus LayerBytes, the layers of its
// checkpoints and templates (layers being admitted included).
func (r *Registry) Usage(ctx context.Context, t api.Tenant) (api.TenantQuotaUsage, error) {
	r.mu.Lock()
	m := r.quota.meters
	r.mu.Unlock()
	now := r.now()
	start, end := periodOf(t.Quotas, now)
	u := api.TenantQuotaUsage{PeriodStart: start.UTC(), PeriodEndsAt: end.UTC()}
	if m.Holdings != nil {
		u.Sandboxes, u.DiskBytes = m.Holdings(t.ID)
	}
	if m.Layers != nil && !ownedByAdmin(t.ID) {
		lb, err := r.layerBytes(ctx, t.ID, "")
		if err != nil {
			return api.TenantQuotaUsage{}, err
		}
		u.LayerBytes = lb
		u.DiskBytes += lb
	}
	if m.CPUSeconds != nil {
		cpu, err := m.CPUSeconds(ctx, t.ID, start)
		if err != nil {
			return api.TenantQuotaUsage{}, err
		}
		u.CPUSeconds = cpu
	}
	return u, nil
}
