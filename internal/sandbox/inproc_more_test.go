package sandbox_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock/clocktest"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
	"github.com/agentbox/agentbox/internal/templatesvc"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/upgrade"
)

// Tenants see only their own sandboxes and templates; a tenant with
// sandboxes is not purged, one without is.
func TestInprocTenants(t *testing.T) {
	h := sandboxtest.New(t)
	ts := templatesvc.New(templatesvc.Config{Templates: h.Templates, Layers: h.Layers, Sandboxes: h.M})
	ctx := ctxT(t)
	acme := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "acme", Scope: api.ScopeFull})
	other := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "other", Scope: api.ScopeFull})
	sb, err := h.M.CreateSandbox(acme, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Tenant != "acme" {
		t.Fatalf("tenant = %q", sb.Tenant)
	}
	if _, err := h.M.GetSandbox(other, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant sees the sandbox: %v", err)
	}
	if l, _ := h.M.ListSandboxes(other, nil); len(l) != 0 {
		t.Fatalf("another tenant lists %d sandboxes", len(l))
	}
	if l, _ := h.M.ListSandboxes(ctx, nil); len(l) != 1 {
		t.Fatalf("the admin lists %d sandboxes", len(l))
	}
	if _, err := ts.SaveTemplate(acme, sb.ID, api.SaveTemplateRequest{Name: "mine"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.GetTemplate(other, "mine"); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant sees the template: %v", err)
	}
	if n, _ := h.M.Holdings("acme"); n != 1 {
		t.Fatalf("Holdings(acme) = %d sandboxes", n)
	}
	if _, err := sandbox.LayerBytes(ctx, h.M, "acme", nil); err != nil {
		t.Fatal(err)
	}
	if err := h.M.PurgeTenant(ctx, "acme"); !errdefs.IsConflict(err) {
		t.Fatalf("purging a tenant with sandboxes: %v", err)
	}
	if err := h.M.PurgeTenant(ctx, api.AdminTenant); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("purging the admin: %v", err)
	}
	if err := h.M.DeleteSandbox(acme, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.M.PurgeTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.GetTemplate(acme, "mine"); !errdefs.IsNotFound(err) {
		t.Fatalf("template after purge: %v", err)
	}
}

// The idle policy pauses a real guest (its processes stopped), hibernates
// it (its processes gone) and a call wakes it; the lifetime deletes it.
// (The policy ignores background processes: by default the one started
// here would keep the sandbox awake, TestInprocIdleKeepsBackgroundAwake.)
func TestInprocIdleAndLifetime(t *testing.T) {
	clk := clocktest.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	h := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) { c.Clock = clk })
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{Lifecycle: api.LifecyclePersistent, Idle: &api.IdlePolicy{PauseAfterSeconds: 60, HibernateAfterSeconds: 120, IgnoreBackground: true}})
	if _, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(60 * time.Second)
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StatePaused {
		t.Fatalf("after 60s idle: %s", got.State)
	}
	clk.Advance(60 * time.Second)
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StateHibernated {
		t.Fatalf("after 120s idle: %s", got.State)
	}
	if p := inproc.Processes(sb.ID); len(p) != 0 {
		t.Fatalf("processes of a hibernated sandbox: %v", p)
	}
	if ps, err := sandboxfiles.New(h.M).ListProcesses(ctx, sb.ID); err != nil || len(ps) != 0 {
		t.Fatalf("processes after wake = %+v, %v", ps, err)
	}
	if got, _ := h.M.GetSandbox(ctx, sb.ID); got.State != api.StateRunning {
		t.Fatalf("after a call: %s", got.State)
	}

	ttl := h.Create(api.CreateSandboxRequest{TimeoutSeconds: 30})
	clk.Advance(30 * time.Second)
	if _, err := h.M.GetSandbox(ctx, ttl.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("after its lifetime: %v", err)
	}
	if p := inproc.Processes(ttl.ID); len(p) != 0 {
		t.Fatalf("processes of an expired sandbox: %v", p)
	}
}

// The guest's exit is noticed: a sandbox whose guest is gone is reported
// so, and deleting it still works.
func TestInprocGuestExit(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	sb := h.Create(api.CreateSandboxRequest{})
	if err := inproc.New(inproc.Config{}).Cleanup(ctx, h.RuntimeSpec(sb.ID)); err != nil {
		t.Fatal(err)
	}
	sandboxtest.WaitFor(t, "the guest's exit to be noticed", func() bool {
		got, err := h.M.GetSandbox(ctx, sb.ID)
		return err == nil && got.State != api.StateRunning
	})
	if err := h.M.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// Runners: the daemon's own is listed; stats come from the backend.
func TestInprocRunnersAndStats(t *testing.T) {
	h := sandboxtest.New(t)
	u := upgrade.New(upgrade.Config{RunnerDir: h.Config.RunnerDir, IDs: h.Config.IDs, IDRanges: h.Config.IDRanges, Version: h.Config.Version, Sandboxes: h.M})
	ctx := ctxT(t)
	rs, err := u.ListRunners(ctx)
	if err != nil || len(rs) != 1 {
		t.Fatalf("ListRunners = %+v, %v", rs, err)
	}
	sb := h.Create(api.CreateSandboxRequest{})
	if _, err := h.M.StartProcess(ctx, sb.ID, api.ExecRequest{Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	hd, err := h.M.Handle(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := hd.Stats(ctx)
	if err != nil || st.Pids < 2 { // the guest, and the shell or sleep
		t.Fatalf("SandboxStats = %+v, %v", st, err)
	}
	if _, err := u.UpgradeSandbox(ctx, sb.ID, api.UpgradeRequest{RunnerHash: "0123456789abcdef"}); !errdefs.IsNotFound(err) {
		t.Fatalf("upgrade to an unknown runner: %v", err)
	}
}

// A create whose guest cannot start leaves nothing behind: no sandbox,
// no record, no directory, no process.
func TestInprocCreateFailureLeavesNothing(t *testing.T) {
	h := sandboxtest.New(t)
	ctx := ctxT(t)
	bin := filepath.Join(h.Config.RunnerDir, "agentbox")
	if err := os.Rename(bin, bin+".away"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.M.CreateSandbox(ctx, api.CreateSandboxRequest{}); err == nil {
		t.Fatal("create without a guest binary succeeded")
	}
	if l, _ := h.M.ListSandboxes(ctx, nil); len(l) != 0 {
		t.Fatalf("sandboxes after a failed create: %+v", l)
	}
	if recs, err := h.Store.ListSandboxes(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("records after a failed create: %d, %v", len(recs), err)
	}
	entries, err := os.ReadDir(filepath.Join(h.Config.DataDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the sandboxes dir: %s", e.Name())
	}
	if err := os.Rename(bin+".away", bin); err != nil {
		t.Fatal(err)
	}
	h.Create(api.CreateSandboxRequest{}) // and the next create works
}
