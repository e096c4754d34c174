package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// fakeLayers is a settable layer meter: each tenant records layers (its
// checkpoints' and templates'), each layer has a size, and a tenant is
// charged for the union of its recorded layers and the extra ones, each
// once (the chains and the catalogue are the layer store's business, see
// internal/layers ChainsSize).
type fakeLayers struct {
	mu       sync.Mutex
	size     map[string]int64
	recorded map[string]map[string]bool
	err      error
	delay    time.Duration // widens race windows

	calls atomic.Int64
}

func newFakeLayers() *fakeLayers {
	return &fakeLayers{size: map[string]int64{}, recorded: map[string]map[string]bool{}}
}

func (f *fakeLayers) meter(_ context.Context, tenant string, extra []string) (int64, error) {
	f.calls.Add(1)
	f.mu.Lock()
	ids := map[string]bool{}
	for id := range f.recorded[tenant] {
		ids[id] = true
	}
	for _, id := range extra {
		ids[id] = true
	}
	var n int64
	for id := range ids {
		n += f.size[id]
	}
	err, delay := f.err, f.delay
	f.mu.Unlock()
	time.Sleep(delay)
	return n, err
}

// layer makes a layer of size bytes and returns its id.
func (f *fakeLayers) layer(id string, size int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.size[id] = size
	return id
}

// record makes layer id one of tenant's (its record was written), or not.
func (f *fakeLayers) record(tenant, id string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.recorded[tenant] == nil {
		f.recorded[tenant] = map[string]bool{}
	}
	if on {
		f.recorded[tenant][id] = true
	} else {
		delete(f.recorded[tenant], id)
	}
}

func diskMeters(f *fakeMeters, l *fakeLayers) Meters {
	m := f.meters()
	m.Layers = l.meter
	return m
}

func TestAdmitLayer(t *testing.T) {
	const mib = int64(1) << 20
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	r.SetMeters(diskMeters(f, l))
	mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 100 * mib})
	ctx := t.Context()

	// 40 MiB of sandbox disk limits and a 30 MiB checkpoint.
	f.set("acme", 1, 40*mib, 0)
	l.record("acme", l.layer("ck1", 30*mib), true)

	rel1, err := r.AdmitLayer(ctx, "acme", l.layer("ck2", 20*mib))
	if err != nil {
		t.Fatalf("layer within quota (90 of 100 MiB): %v", err)
	}
	// ck2 is reserved until released, so a third goes over.
	_, err = r.AdmitLayer(ctx, "acme", l.layer("ck3", 20*mib))
	if d := wantExhausted(t, err); d != holdRetry {
		t.Errorf("retry hint %v, want %v", d, holdRetry)
	}
	// ck2's record is written, then its reservation released: still full.
	l.record("acme", "ck2", true)
	rel1()
	rel1() // idempotent
	if _, err := r.AdmitLayer(ctx, "acme", "ck3"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("over quota after release of a recorded layer: %v", err)
	}
	// A layer the tenant holds already costs nothing more.
	if rel, err := r.AdmitLayer(ctx, "acme", "ck1"); err != nil {
		t.Errorf("layer already held (same content): %v", err)
	} else {
		rel()
	}
	// Exactly filling the quota is allowed; one byte more is not.
	if rel, err := r.AdmitLayer(ctx, "acme", l.layer("fill", 10*mib)); err != nil {
		t.Errorf("layer filling the quota exactly: %v", err)
	} else {
		rel()
	}
	if _, err := r.AdmitLayer(ctx, "acme", l.layer("byte", 10*mib+1)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("layer one byte over: %v", err)
	}
	// Deleting a checkpoint frees its layer.
	l.record("acme", "ck1", false)
	rel3, err := r.AdmitLayer(ctx, "acme", "ck3")
	if err != nil {
		t.Fatalf("after deleting a checkpoint: %v", err)
	}
	defer rel3()

	// Sandboxes' disk and pending creates count against layers.
	mustCreateTenant(t, r, "sbx", api.Quotas{DiskBytes: 100 * mib, MaxSandboxes: 10})
	_, relSb, err := r.AdmitSandboxes(ctx, "sbx", 1, 90*mib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdmitLayer(ctx, "sbx", l.layer("big", 11*mib)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("layer over a pending create's disk: %v", err)
	}
	relSb()
	if rel, err := r.AdmitLayer(ctx, "sbx", "big"); err != nil {
		t.Errorf("layer once the create failed: %v", err)
	} else {
		rel()
	}
}

func TestAdmitSandboxesCountsLayers(t *testing.T) {
	const mib = int64(1) << 20
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	r.SetMeters(diskMeters(f, l))
	mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 100 * mib, MaxSandboxes: 10})
	ctx := t.Context()

	l.record("acme", l.layer("ck", 70*mib), true)
	relL, err := r.AdmitLayer(ctx, "acme", l.layer("pending", 20*mib))
	if err != nil {
		t.Fatal(err)
	}
	// 90 MiB held by layers (one of them only reserved): 10 MiB left.
	if _, _, err := r.AdmitSandboxes(ctx, "acme", 1, 10*mib+1); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("create asking more than the layers leave: %v", err)
	}
	disk, rel, err := r.AdmitSandboxes(ctx, "acme", 1, 0)
	if err != nil || disk != 10*mib {
		t.Fatalf("create without a disk limit = %d, %v; want what the layers leave (%d)", disk, err, 10*mib)
	}
	rel()
	// The reserved layer was dropped (a failed checkpoint): room again.
	relL()
	if disk, rel, err := r.AdmitSandboxes(ctx, "acme", 1, 0); err != nil || disk != 30*mib {
		t.Errorf("after the reservation's release = %d, %v; want %d", disk, err, 30*mib)
	} else {
		rel()
	}
	// A failing layer meter fails the admission; it is not "over quota".
	l.mu.Lock()
	l.err = errdefs.ErrUnavailable
	l.mu.Unlock()
	if _, _, err := r.AdmitSandboxes(ctx, "acme", 1, 0); !errdefs.IsUnavailable(err) || errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("AdmitSandboxes with a failing layer meter = %v", err)
	}
	if _, err := r.AdmitLayer(ctx, "acme", "pending"); !errdefs.IsUnavailable(err) || errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("AdmitLayer with a failing layer meter = %v", err)
	}
}

func TestAdmitLayerUnlimited(t *testing.T) {
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	r.SetMeters(diskMeters(f, l))
	mustCreateTenant(t, r, "free", api.Quotas{MaxSandboxes: 1, CPUSeconds: 1})
	l.layer("huge", 1<<60)
	for _, tenant := range []string{"free", "ghost", api.AdminTenant, ""} {
		for range 3 {
			rel, err := r.AdmitLayer(t.Context(), tenant, "huge")
			if err != nil {
				t.Fatalf("AdmitLayer(%q) = %v", tenant, err)
			}
			rel()
		}
	}
	// Creates of a tenant without a disk quota do not meter layers.
	if _, rel, err := r.AdmitSandboxes(t.Context(), "free", 1, 0); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
	if n := l.calls.Load(); n != 0 {
		t.Errorf("layer meter called %d times for tenants without a disk quota", n)
	}

	// Without a layer meter, layers are not limited (and not counted).
	r2, _ := newRegistry(t)
	r2.SetMeters(f.meters())
	mustCreateTenant(t, r2, "acme", api.Quotas{DiskBytes: 1})
	if rel, err := r2.AdmitLayer(t.Context(), "acme", "huge"); err != nil {
		t.Errorf("AdmitLayer without a layer meter = %v", err)
	} else {
		rel()
	}
}

// TestAdmitLayerConcurrent races checkpoints (admit, write the record,
// release) and creates of one tenant: together they never take more than
// the quota, and what is freed is admitted again.
func TestAdmitLayerConcurrent(t *testing.T) {
	const mib = int64(1) << 20
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	l.delay = time.Millisecond
	r.SetMeters(diskMeters(f, l))
	mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 10 * mib, MaxSandboxes: 100})
	mustCreateTenant(t, r, "other", api.Quotas{DiskBytes: 10 * mib})
	ctx := t.Context()

	var (
		mu      sync.Mutex
		layers  []string // recorded by acme
		sbDisk  int64    // acme's sandboxes, as the holdings meter counts them
		serial  atomic.Int64
		refused atomic.Int64
	)
	checkpoint := func(tenant string) {
		id := l.layer(fmt.Sprintf("%s-%d", tenant, serial.Add(1)), mib)
		release, err := r.AdmitLayer(ctx, tenant, id)
		if err != nil {
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Errorf("AdmitLayer: %v", err)
			}
			refused.Add(1)
			return
		}
		// The record is written, and counted, before the release.
		l.record(tenant, id, true)
		release()
		if tenant == "acme" {
			mu.Lock()
			layers = append(layers, id)
			mu.Unlock()
		}
	}
	create := func() {
		disk, release, err := r.AdmitSandboxes(ctx, "acme", 1, mib)
		if err != nil {
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Errorf("AdmitSandboxes: %v", err)
			}
			refused.Add(1)
			return
		}
		mu.Lock()
		sbDisk += disk
		f.set("acme", 0, sbDisk, 0)
		mu.Unlock()
		release()
	}
	race := func(checkpoints, creates int) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range checkpoints + creates {
			wg.Go(func() {
				<-start
				if i < checkpoints {
					checkpoint("acme")
					checkpoint("other") // another tenant's quota is its own
				} else {
					create()
				}
			})
		}
		close(start)
		wg.Wait()
	}
	used := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(layers))*mib + sbDisk
	}

	race(16, 8)
	if got := used(); got != 10*mib {
		t.Fatalf("after the race acme holds %d MiB, want exactly its 10 MiB quota", got/mib)
	}
	if n := len(l.recorded["other"]); n != 10 {
		t.Errorf("other tenant got %d layers, want 10", n)
	}
	// Full: nothing more, however many try.
	race(8, 4)
	if got := used(); got != 10*mib {
		t.Fatalf("a full quota let %d MiB more in", (got-10*mib)/mib)
	}
	// Deleting three checkpoints makes room for exactly three. (At most
	// eight creates raced sixteen checkpoints for ten MiB, so at least two
	// checkpoints got in; fewer than three when the creates won.)
	mu.Lock()
	k := min(3, len(layers))
	if k < 2 {
		mu.Unlock()
		t.Fatalf("the first race admitted %d checkpoints, want at least 2", k)
	}
	for _, id := range layers[:k] {
		l.record("acme", id, false)
	}
	layers = layers[k:]
	mu.Unlock()
	race(8, 4)
	if got := used(); got != 10*mib {
		t.Fatalf("after deleting %d MiB acme holds %d MiB, want 10", k, got/mib)
	}
	r.mu.Lock()
	left := len(r.quota.layers["acme"])
	r.mu.Unlock()
	if left != 0 {
		t.Errorf("%d layer reservations left after every release", left)
	}
}

func TestUsageCountsLayers(t *testing.T) {
	const mib = int64(1) << 20
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	r.SetMeters(diskMeters(f, l))
	tn := mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 100 * mib})
	f.set("acme", 2, 64*mib, 0)
	l.record("acme", l.layer("ck", 30*mib), true)
	rel, err := r.AdmitLayer(t.Context(), "acme", l.layer("saving", 5*mib))
	if err != nil {
		t.Fatal(err)
	}
	u, err := r.Usage(t.Context(), tn)
	if err != nil {
		t.Fatal(err)
	}
	if u.Sandboxes != 2 || u.LayerBytes != 35*mib || u.DiskBytes != 99*mib {
		t.Errorf("Usage = %d sandboxes, %d layer bytes, %d disk bytes; want 2, %d, %d", u.Sandboxes, u.LayerBytes, u.DiskBytes, 35*mib, 99*mib)
	}
	rel()
	if u, _ := r.Usage(t.Context(), tn); u.LayerBytes != 30*mib || u.DiskBytes != 94*mib {
		t.Errorf("Usage after the reservation's release = %+v", u)
	}
}

// A template's layer is charged to the template's tenant (the qualifier
// of its stored name); the admin's templates are not limited.
func TestAdmitTemplateLayer(t *testing.T) {
	const mib = int64(1) << 20
	r, _ := newRegistry(t)
	f, l := newFakeMeters(), newFakeLayers()
	r.SetMeters(diskMeters(f, l))
	mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 10 * mib})
	ctx := t.Context()
	if _, err := r.AdmitTemplateLayer(ctx, tenant.Qualify("acme", "big"), l.layer("t1", 11*mib)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("acme's template layer over acme's quota: %v", err)
	}
	rel, err := r.AdmitTemplateLayer(ctx, tenant.Qualify("acme", "small"), l.layer("t2", 5*mib))
	if err != nil {
		t.Fatalf("acme's template layer within its quota: %v", err)
	}
	rel()
	rel, err = r.AdmitTemplateLayer(ctx, tenant.Qualify(api.AdminTenant, "catalogue"), l.layer("t3", 100*mib))
	if err != nil {
		t.Fatalf("the admin's template layer: %v", err)
	}
	rel()
}
