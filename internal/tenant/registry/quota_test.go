package registry

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// fakeMeters is a settable pair of quota meters that counts its calls.
type fakeMeters struct {
	mu        sync.Mutex
	sandboxes map[string]int
	disk      map[string]int64
	cpu       map[string]float64
	cpuErr    error

	holdingsCalls atomic.Int64
	cpuCalls      atomic.Int64
	lastSince     atomic.Value // time.Time
}

func newFakeMeters() *fakeMeters {
	return &fakeMeters{sandboxes: map[string]int{}, disk: map[string]int64{}, cpu: map[string]float64{}}
}

func (f *fakeMeters) meters() Meters {
	return Meters{
		Holdings: func(tenant string) (int, int64) {
			f.holdingsCalls.Add(1)
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.sandboxes[tenant], f.disk[tenant]
		},
		CPUSeconds: func(_ context.Context, tenant string, since time.Time) (float64, error) {
			f.cpuCalls.Add(1)
			f.lastSince.Store(since)
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.cpu[tenant], f.cpuErr
		},
	}
}

func (f *fakeMeters) set(tenant string, sandboxes int, disk int64, cpu float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[tenant], f.disk[tenant], f.cpu[tenant] = sandboxes, disk, cpu
}

// wantExhausted fails unless err is ErrResourceExhausted with a positive
// retry hint, and returns the hint.
func wantExhausted(t *testing.T, err error) time.Duration {
	t.Helper()
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("err = %v, want ErrResourceExhausted", err)
	}
	d, ok := errdefs.RetryAfter(err)
	if !ok || d <= 0 {
		t.Fatalf("RetryAfter(%v) = %v, %v; want a positive hint", err, d, ok)
	}
	return d
}

// Before the meters are connected a quota cannot be measured: admitting
// anything against it fails closed (a daemon that wired them late let
// start-up runs past the quota), while tenants without quotas and the
// admin are admitted as always.
func TestQuotasFailClosedWithoutMeters(t *testing.T) {
	r, _ := newRegistry(t)
	mustCreateTenant(t, r, "acme", api.Quotas{MaxSandboxes: 1, CPUSeconds: 1, DiskBytes: 1})
	mustCreateTenant(t, r, "free", api.Quotas{})
	if _, _, err := r.AdmitSandboxes(t.Context(), "acme", 1, 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("AdmitSandboxes without meters = %v, want ErrUnavailable", err)
	}
	if err := r.AdmitRun(t.Context(), "acme"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("AdmitRun without meters = %v, want ErrUnavailable", err)
	}
	if _, err := r.AdmitLayer(t.Context(), "acme", "layer"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("AdmitLayer without meters = %v, want ErrUnavailable", err)
	}
	for _, tn := range []string{"free", api.AdminTenant} {
		_, release, err := r.AdmitSandboxes(t.Context(), tn, 2, 0)
		if err != nil {
			t.Fatalf("AdmitSandboxes(%s) without meters = %v", tn, err)
		}
		release()
		if err := r.AdmitRun(t.Context(), tn); err != nil {
			t.Errorf("AdmitRun(%s) without meters = %v", tn, err)
		}
		rel, err := r.AdmitLayer(t.Context(), tn, "layer")
		if err != nil {
			t.Errorf("AdmitLayer(%s) without meters = %v", tn, err)
		} else {
			rel()
		}
	}
}

func TestAdmitSandboxesMax(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	mustCreateTenant(t, r, "acme", api.Quotas{MaxSandboxes: 3})
	ctx := t.Context()

	f.set("acme", 2, 0, 0)
	disk, release, err := r.AdmitSandboxes(ctx, "acme", 1, 123)
	if err != nil {
		t.Fatalf("admit 3rd of 3: %v", err)
	}
	if disk != 123 {
		t.Errorf("disk = %d, want the asked 123 (no disk quota)", disk)
	}
	// The reservation counts until released.
	_, _, err = r.AdmitSandboxes(ctx, "acme", 1, 0)
	wantExhausted(t, err)
	release()
	if _, rel, err := r.AdmitSandboxes(ctx, "acme", 1, 0); err != nil {
		t.Errorf("admit after release: %v", err)
	} else {
		rel()
	}
	// Asking for more than is left at once.
	_, _, err = r.AdmitSandboxes(ctx, "acme", 2, 0)
	if d := wantExhausted(t, err); d != holdRetry {
		t.Errorf("retry hint %v, want %v", d, holdRetry)
	}
	// A huge n cannot wrap around the count.
	_, _, err = r.AdmitSandboxes(ctx, "acme", math.MaxInt, 0)
	wantExhausted(t, err)
	// Once the meter counts three, nothing more.
	f.set("acme", 3, 0, 0)
	_, _, err = r.AdmitSandboxes(ctx, "acme", 1, 0)
	wantExhausted(t, err)
	// n <= 0 asks for nothing.
	if _, rel, err := r.AdmitSandboxes(ctx, "acme", 0, 0); err != nil {
		t.Errorf("n=0: %v", err)
	} else {
		rel()
	}

	// Other tenants are unaffected: unlimited, unknown, and the admin.
	mustCreateTenant(t, r, "free", api.Quotas{})
	f.set("free", 1000, 1<<40, 0)
	for _, tenant := range []string{"free", "ghost", api.AdminTenant, ""} {
		disk, rel, err := r.AdmitSandboxes(ctx, tenant, 50, 7)
		if err != nil || disk != 7 {
			t.Errorf("AdmitSandboxes(%q) = %d, %v; want 7, nil", tenant, disk, err)
			continue
		}
		rel()
	}
}

func TestAdmitSandboxesConcurrent(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters() // holdings stay 0: only reservations count
	r.SetMeters(f.meters())
	mustCreateTenant(t, r, "acme", api.Quotas{MaxSandboxes: 5})

	admitAll := func(n int) (releases []func(), refused int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				_, release, err := r.AdmitSandboxes(t.Context(), "acme", 1, 0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if !errors.Is(err, errdefs.ErrResourceExhausted) {
						t.Errorf("AdmitSandboxes: %v", err)
					}
					if d, ok := errdefs.RetryAfter(err); !ok || d <= 0 {
						t.Errorf("no retry hint on %v", err)
					}
					refused++
					return
				}
				releases = append(releases, release)
			})
		}
		close(start)
		wg.Wait()
		return releases, refused
	}

	held, refused := admitAll(20)
	if len(held) != 5 || refused != 15 {
		t.Fatalf("%d admitted, %d refused; want 5, 15", len(held), refused)
	}
	// Still full while none is released.
	if more, _ := admitAll(10); len(more) != 0 {
		t.Fatalf("%d admitted over a full quota", len(more))
	}
	// Releasing two (one of them twice: a release is idempotent) makes
	// room for exactly two.
	held[0]()
	held[0]()
	held[1]()
	more, _ := admitAll(10)
	if len(more) != 2 {
		t.Fatalf("after releasing 2: %d admitted, want 2", len(more))
	}
	for _, rel := range append(held[2:], more...) {
		rel()
	}
	all, _ := admitAll(20)
	if len(all) != 5 {
		t.Errorf("after releasing all: %d admitted, want 5", len(all))
	}
	for _, rel := range all {
		rel()
	}
	r.mu.Lock()
	res := *r.quota.pending["acme"]
	r.mu.Unlock()
	if res != (reservation{}) {
		t.Errorf("reservation left after every release: %+v", res)
	}
}

func TestAdmitSandboxesDisk(t *testing.T) {
	const gib = int64(1) << 30
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		quota    int64
		heldDisk int64
		n        int
		ask      int64
		want     int64 // 0: refused
	}{
		{"default when plenty left", 10 * gib, 0, 1, 0, api.DefaultTenantDiskBytes},
		{"default for each of n", 10 * gib, 0, 3, 0, api.DefaultTenantDiskBytes},
		{"what is left when less", 10 * gib, 9*gib + gib/2, 1, 0, gib / 2},
		{"what is left split evenly", 10 * gib, 9 * gib, 4, 0, gib / 4},
		{"split rounds down", 10 * gib, 10*gib - 5, 2, 0, 2},
		{"less than a byte each", 10 * gib, 10*gib - 1, 2, 0, 0},
		{"nothing left", 10 * gib, 10 * gib, 1, 0, 0},
		{"over already", 10 * gib, 11 * gib, 1, 0, 0},
		{"asked fits", 10 * gib, 2 * gib, 1, 8 * gib, 8 * gib},
		{"asked fits n", 10 * gib, 2 * gib, 4, 2 * gib, 2 * gib},
		{"asked over", 10 * gib, 2 * gib, 1, 8*gib + 1, 0},
		{"asked over n", 10 * gib, 2 * gib, 3, 3 * gib, 0},
		// disk*n must not wrap around to a small number.
		{"asked overflows", 10 * gib, 0, 2, 1 << 62, 0},
		{"asked overflows more", 10 * gib, 0, 4, 1 << 62, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newRegistry(t)
			f := newFakeMeters()
			r.SetMeters(f.meters())
			mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: tc.quota})
			f.set("acme", 0, tc.heldDisk, 0)
			disk, release, err := r.AdmitSandboxes(ctx, "acme", tc.n, tc.ask)
			if tc.want == 0 {
				if err == nil {
					t.Fatalf("admitted with %d bytes each, want refused", disk)
				}
				if d := wantExhausted(t, err); d != holdRetry {
					t.Errorf("retry hint %v, want %v", d, holdRetry)
				}
				return
			}
			if err != nil {
				t.Fatalf("AdmitSandboxes: %v", err)
			}
			defer release()
			if disk != tc.want {
				t.Errorf("disk each = %d, want %d", disk, tc.want)
			}
		})
	}
}

func TestAdmitSandboxesDiskReservations(t *testing.T) {
	const gib = int64(1) << 30
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	mustCreateTenant(t, r, "acme", api.Quotas{DiskBytes: 2*gib + gib/2, MaxSandboxes: 10})
	ctx := t.Context()

	d1, rel1, err := r.AdmitSandboxes(ctx, "acme", 1, 0)
	if err != nil || d1 != gib {
		t.Fatalf("first = %d, %v", d1, err)
	}
	d2, rel2, err := r.AdmitSandboxes(ctx, "acme", 1, 0)
	if err != nil || d2 != gib {
		t.Fatalf("second = %d, %v", d2, err)
	}
	// Half a GiB is left, reserved by nobody yet.
	d3, rel3, err := r.AdmitSandboxes(ctx, "acme", 1, 0)
	if err != nil || d3 != gib/2 {
		t.Fatalf("third = %d, %v; want what is left", d3, err)
	}
	_, _, err = r.AdmitSandboxes(ctx, "acme", 1, 0)
	wantExhausted(t, err)
	// The first sandbox now exists: counted by the meter, reservation
	// released. Nothing changes in sum.
	f.set("acme", 1, gib, 0)
	rel1()
	_, _, err = r.AdmitSandboxes(ctx, "acme", 1, 1)
	wantExhausted(t, err)
	// The second failed: its reservation goes without the meter counting.
	rel2()
	if d, rel, err := r.AdmitSandboxes(ctx, "acme", 1, 0); err != nil || d != gib {
		t.Errorf("after a failed create = %d, %v; want %d", d, err, gib)
	} else {
		rel()
	}
	rel3()
}

func TestAdmitRunCPU(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	// 1000 s periods are aligned to the Unix epoch: at second 1_000_000_250
	// the period began at 1_000_000_000 and ends 750 s later.
	now := time.Unix(1_000_000_250, 0)
	r.now = func() time.Time { return now }
	mustCreateTenant(t, r, "acme", api.Quotas{CPUSeconds: 10, PeriodSeconds: 1000})
	ctx := t.Context()

	f.set("acme", 0, 0, 9.5)
	if err := r.AdmitRun(ctx, "acme"); err != nil {
		t.Fatalf("under quota: %v", err)
	}
	if got := f.lastSince.Load().(time.Time); !got.Equal(time.Unix(1_000_000_000, 0)) {
		t.Errorf("meter asked since %v, want the period start %v", got, time.Unix(1_000_000_000, 0))
	}
	// Within a second the cached figure is used.
	f.set("acme", 0, 0, 10)
	now = now.Add(999 * time.Millisecond)
	if err := r.AdmitRun(ctx, "acme"); err != nil {
		t.Errorf("cached figure ignored: %v", err)
	}
	if n := f.cpuCalls.Load(); n != 1 {
		t.Errorf("meter called %d times for two calls within a second, want 1", n)
	}
	// A second later the meter is asked again, and the quota is spent.
	now = time.Unix(1_000_000_251, 0)
	err := r.AdmitRun(ctx, "acme")
	if d := wantExhausted(t, err); d != 749*time.Second {
		t.Errorf("retry hint %v, want 749s (to the period's end)", d)
	}
	if n := f.cpuCalls.Load(); n != 2 {
		t.Errorf("meter called %d times, want 2", n)
	}
	// Creates are refused as well while the CPU quota is spent.
	_, _, err = r.AdmitSandboxes(ctx, "acme", 1, 0)
	if d := wantExhausted(t, err); d != 749*time.Second {
		t.Errorf("AdmitSandboxes retry hint %v, want 749s", d)
	}
	// A new period starts afresh: the cache is per period, not just per
	// second.
	f.set("acme", 0, 0, 0)
	now = time.Unix(1_000_001_000, 0)
	if err := r.AdmitRun(ctx, "acme"); err != nil {
		t.Errorf("new period: %v", err)
	}
	if got := f.lastSince.Load().(time.Time); !got.Equal(now) {
		t.Errorf("new period metered since %v, want %v", got, now)
	}

	// A meter error is passed on, not taken for "over quota".
	f.mu.Lock()
	f.cpuErr = errdefs.ErrUnavailable
	f.mu.Unlock()
	now = now.Add(time.Minute)
	if err := r.AdmitRun(ctx, "acme"); !errdefs.IsUnavailable(err) || errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("meter failure = %v", err)
	}
}

func TestAdmitRunDefaultPeriod(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	now := time.Date(2030, 5, 6, 7, 50, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	mustCreateTenant(t, r, "acme", api.Quotas{CPUSeconds: 1})
	f.set("acme", 0, 0, 1)
	d := wantExhausted(t, r.AdmitRun(t.Context(), "acme"))
	if d != 10*time.Minute {
		t.Errorf("retry hint %v, want 10m (to the top of the hour)", d)
	}
	if got := f.lastSince.Load().(time.Time); !got.Equal(time.Date(2030, 5, 6, 7, 0, 0, 0, time.UTC)) {
		t.Errorf("metered since %v", got)
	}
}

func TestAdmitRunUnlimited(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	mustCreateTenant(t, r, "free", api.Quotas{MaxSandboxes: 1})
	f.set("free", 0, 0, 1e9)
	f.set(api.AdminTenant, 0, 0, 1e9)
	for _, tenant := range []string{"free", "ghost", api.AdminTenant, ""} {
		if err := r.AdmitRun(t.Context(), tenant); err != nil {
			t.Errorf("AdmitRun(%q) = %v", tenant, err)
		}
	}
	if n := f.cpuCalls.Load(); n != 0 {
		t.Errorf("CPU meter called %d times for tenants without a CPU quota", n)
	}
	if n := f.holdingsCalls.Load(); n != 0 {
		t.Errorf("holdings meter called %d times", n)
	}
}

func TestAdminNeverLimited(t *testing.T) {
	r, _ := newRegistry(t)
	f := newFakeMeters()
	r.SetMeters(f.meters())
	f.set(api.AdminTenant, 1<<20, 1<<60, 1e12)
	for _, tenant := range []string{api.AdminTenant, ""} {
		for range 3 {
			disk, release, err := r.AdmitSandboxes(t.Context(), tenant, 100, 0)
			if err != nil || disk != 0 {
				t.Fatalf("admin AdmitSandboxes = %d, %v", disk, err)
			}
			release()
		}
	}
	if f.cpuCalls.Load() != 0 || f.holdingsCalls.Load() != 0 {
		t.Error("meters consulted for the admin")
	}
}

func TestUsage(t *testing.T) {
	r, _ := newRegistry(t)
	now := time.Unix(1_000_000_250, 0)
	r.now = func() time.Time { return now }
	tn := mustCreateTenant(t, r, "acme", api.Quotas{PeriodSeconds: 1000, CPUSeconds: 5})

	// Without meters, only the period.
	u, err := r.Usage(t.Context(), tn)
	if err != nil {
		t.Fatal(err)
	}
	want := api.TenantQuotaUsage{PeriodStart: time.Unix(1_000_000_000, 0).UTC(), PeriodEndsAt: time.Unix(1_000_001_000, 0).UTC()}
	if u != want {
		t.Errorf("Usage without meters = %+v, want %+v", u, want)
	}

	f := newFakeMeters()
	r.SetMeters(f.meters())
	f.set("acme", 3, 1234, 4.25)
	u, err = r.Usage(t.Context(), tn)
	if err != nil {
		t.Fatal(err)
	}
	want.Sandboxes, want.DiskBytes, want.CPUSeconds = 3, 1234, 4.25
	if u != want {
		t.Errorf("Usage = %+v, want %+v", u, want)
	}
	if u.PeriodStart.Location() != time.UTC || u.PeriodEndsAt.Location() != time.UTC {
		t.Error("period times not in UTC")
	}
	// Usage always meters afresh (it is what GET shows).
	f.set("acme", 3, 1234, 4.5)
	if u, _ := r.Usage(t.Context(), tn); u.CPUSeconds != 4.5 {
		t.Errorf("Usage served a cached CPU figure %v", u.CPUSeconds)
	}

	f.mu.Lock()
	f.cpuErr = errdefs.ErrUnavailable
	f.mu.Unlock()
	if _, err := r.Usage(t.Context(), tn); !errdefs.IsUnavailable(err) {
		t.Errorf("Usage with a failing meter = %v", err)
	}
}
