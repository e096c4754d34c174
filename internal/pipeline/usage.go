package pipeline

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/store"
)

// Metering is derived from the run records, so every trigger is metered
// the same way: usage is the sum of the usage of the runs (finished and
// running) that started in the period.

// Usage sums the usage of the runs of sandbox (all when "") started at or
// after since (all when zero), per tenant and per sandbox, each split by
// trigger.
func (p *Pipeline) Usage(ctx context.Context, sandbox string, since time.Time) (api.Usage, error) {
	runs, err := p.List(ctx, store.RunFilter{Sandbox: sandbox, Since: since})
	if err != nil {
		return api.Usage{}, err
	}
	u := api.Usage{Until: p.clk.Now().UTC(), Tenants: []api.TenantUsage{}, Sandboxes: []api.SandboxUsage{}}
	if !since.IsZero() {
		s := since.UTC()
		u.Since = &s
	}
	tenants := map[string]*api.TenantUsage{}
	boxes := map[string]*api.SandboxUsage{}
	for _, r := range runs {
		t := tenants[r.Tenant]
		if t == nil {
			t = &api.TenantUsage{Tenant: r.Tenant}
			tenants[r.Tenant] = t
		}
		add(&t.Totals, r)
		if r.Sandbox == "" {
			continue
		}
		b := boxes[r.Sandbox]
		if b == nil {
			b = &api.SandboxUsage{Sandbox: r.Sandbox, Template: r.Template, Tenant: r.Tenant}
			boxes[r.Sandbox] = b
		}
		add(&b.Totals, r)
	}
	for _, t := range tenants {
		u.Tenants = append(u.Tenants, *t)
	}
	for _, b := range boxes {
		u.Sandboxes = append(u.Sandboxes, *b)
	}
	slices.SortFunc(u.Tenants, func(a, b api.TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) })
	slices.SortFunc(u.Sandboxes, func(a, b api.SandboxUsage) int { return strings.Compare(a.Sandbox, b.Sandbox) })
	return u, nil
}

func add(t *api.UsageTotals, r api.Run) {
	addFlat(t, r)
	if t.ByTrigger == nil {
		t.ByTrigger = map[string]api.UsageTotals{}
	}
	bt := t.ByTrigger[r.Trigger]
	addFlat(&bt, r)
	t.ByTrigger[r.Trigger] = bt
}

func addFlat(t *api.UsageTotals, r api.Run) {
	t.Runs++
	t.CPUSeconds += r.Usage.CPUSeconds
	t.MemoryGBSeconds += r.Usage.MemoryGBSeconds
	t.EgressBytes += r.Usage.EgressBytes
}

// ExportUsage calls emit with one record per finished run of sandbox
// (all when "") started at or after since, oldest first.
func (p *Pipeline) ExportUsage(ctx context.Context, sandbox string, since time.Time, emit func(api.UsageRecord) error) error {
	runs, err := p.List(ctx, store.RunFilter{Sandbox: sandbox, Since: since})
	if err != nil {
		return err
	}
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		if r.State == api.RunRunning {
			continue
		}
		if err := emit(api.UsageRecord{
			Run: r.ID, Tenant: r.Tenant, Sandbox: r.Sandbox, Template: r.Template,
			Trigger: r.Trigger, Who: r.Who, StartedAt: r.StartedAt, DurationSeconds: r.DurationSeconds,
			CPUSeconds: r.Usage.CPUSeconds, MemoryGBSeconds: r.Usage.MemoryGBSeconds,
			EgressBytes: r.Usage.EgressBytes, ExitCode: r.ExitCode,
		}); err != nil {
			return err
		}
	}
	return nil
}
