package test

import (
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/store"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Finding 8 of issue 11: durability and tenancy. The attacker is whoever
// profits from a run nobody meters (a daemon killed mid-exec), from a
// tenant name that is reused (the new owner inherits the old one's
// objects), or from the start-up window in which missed scheduled runs
// were admitted before quotas were.

// waitRun polls run id until cond holds or the deadline passes, and
// returns the last record seen.
func waitRun(t *testing.T, c *agentbox.Client, id string, d time.Duration, cond func(api.Run) bool) (api.Run, error) {
	t.Helper()
	var (
		r   api.Run
		err error
	)
	for deadline := time.Now().Add(d); ; {
		r, err = c.Run(context.Background(), id)
		if err == nil && cond(r) {
			return r, nil
		}
		if time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAdversarialDurabilityExecSurvivesDaemonKill SIGKILLs the daemon
// while two commands run in a sandbox: one that outlives the outage and
// one that ends during it. After the restart both runs have records: the
// first is running (its process still is) and finishes with its exit code
// when it ends; the second is finished with the exit code the guest kept.
func TestAdversarialDurabilityExecSurvivesDaemonKill(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	ctx := context.Background()

	// A foreground exec whose caller is cut off by the crash, and a
	// background one.
	long := make(chan error, 1)
	go func() {
		// It burns CPU for up to 2 s, writes the CPU its children used
		// (clock ticks, from /proc), and sleeps on.
		_, err := sb.Run(ctx, "timeout 2 sh -c 'while :; do :; done'; set -- $(cat /proc/$$/stat); echo $((${16}+${17})) > /root/burnt; sleep 4; exit 7")
		long <- err
	}()
	if _, err := sb.Start(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1; exit 3"}}); err != nil {
		t.Fatal(err)
	}
	var longID, shortID string
	for deadline := time.Now().Add(10 * time.Second); longID == "" || shortID == ""; {
		runs, err := d.client.Runs(ctx, agentbox.RunQuery{Sandbox: sb.ID()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if r.State != api.RunRunning {
				continue
			}
			switch {
			case strings.Contains(r.Command, "exit 7"):
				longID = r.ID
			case len(r.Cmd) == 3 && strings.Contains(r.Cmd[2], "exit 3"):
				shortID = r.ID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two runs are not both running: %+v", runs)
		}
		time.Sleep(50 * time.Millisecond)
	}

	d.stop(syscall.SIGKILL)
	<-long
	time.Sleep(2 * time.Second) // the short command ends during the outage
	d.start()

	r, err := d.client.Run(ctx, longID)
	if err != nil {
		t.Fatalf("after the daemon was killed mid-exec, the run still in flight has no record: %v", err)
	}
	if r.State != api.RunRunning {
		t.Fatalf("run %s (its process still runs) is %q after the restart, want running: %+v", longID, r.State, r)
	}
	r, err = waitRun(t, d.client, shortID, 10*time.Second, func(r api.Run) bool { return r.State != api.RunRunning })
	if err != nil {
		t.Fatalf("after the daemon was killed mid-exec, the run that ended during the outage has no record: %v", err)
	}
	if r.State != api.RunFinished || r.ExitCode == nil || *r.ExitCode != 3 || r.EndedAt == nil {
		t.Fatalf("run %s ended during the outage with exit 3; its record is %+v", shortID, r)
	}
	r, err = waitRun(t, d.client, longID, 20*time.Second, func(r api.Run) bool { return r.State != api.RunRunning })
	if err != nil {
		t.Fatal(err)
	}
	if r.State != api.RunFinished || r.ExitCode == nil || *r.ExitCode != 7 {
		t.Fatalf("run %s exited 7 after the restart; its record is %+v", longID, r)
	}
	if r.DurationSeconds < 5 {
		t.Errorf("run %s ran about 6 s but its record says %.1f s", longID, r.DurationSeconds)
	}
	// Metered over the whole run, the outage included: the sandbox-wide
	// charge covers at least what the command burnt (mostly while no
	// daemon ran).
	b, err := sb.ReadFile(ctx, "/root/burnt")
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("burnt %q: %v", b, err)
	}
	if burnt := float64(ticks) / 100; r.Usage.CPUSeconds < 0.9*burnt {
		t.Errorf("run %s burnt %.2f CPU-seconds; its record charges %.2f", longID, burnt, r.Usage.CPUSeconds)
	} else {
		t.Logf("run %s burnt %.2f CPU-seconds; its record charges %.2f", longID, burnt, r.Usage.CPUSeconds)
	}
	// The recovered records are durable: another restart keeps them.
	d.restart(syscall.SIGTERM)
	for _, id := range []string{longID, shortID} {
		if r, err := d.client.Run(ctx, id); err != nil || r.State != api.RunFinished {
			t.Errorf("run %s after a second restart: %+v %v", id, r, err)
		}
	}
}

// TestAdversarialDurabilityRunLostWithItsSandbox kills the daemon during
// a run, then, while no daemon runs, the run's sandbox (every process of
// it, guest included: as an OOM kill or a host admin might). The next
// daemon records the run as lost rather than leaving it without a record
// or running forever.
func TestAdversarialDurabilityRunLostWithItsSandbox(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	ctx := context.Background()
	if _, err := sb.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	runs, err := d.client.Runs(ctx, agentbox.RunQuery{Sandbox: sb.ID()})
	if err != nil || len(runs) != 1 || runs[0].State != api.RunRunning {
		t.Fatalf("runs before the kill: %+v %v", runs, err)
	}
	id := runs[0].ID
	d.stop(syscall.SIGKILL)
	// The sandbox's processes, guest included, are those in its cgroup.
	pids := sandboxPids(t, sb.ID())
	if len(pids) == 0 {
		t.Fatalf("no process in sandbox %s's cgroup", sb.ID())
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(sandboxPids(t, sb.ID())) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's processes outlive SIGKILL: %v", sandboxPids(t, sb.ID()))
		}
	}
	d.start()
	r, err := waitRun(t, d.client, id, 10*time.Second, func(r api.Run) bool { return r.State != api.RunRunning })
	if err != nil {
		t.Fatalf("the run whose sandbox died during the outage has no record: %v", err)
	}
	if r.State != api.RunLost || r.EndedAt == nil || r.Error == "" {
		t.Fatalf("the run whose sandbox died during the outage: %+v, want lost", r)
	}
}

// acmeObjects gives tenant acme (client c) a secret, a saved template, a
// checkpoint and a run in a sandbox it then deletes.
func acmeObjects(t *testing.T, c *agentbox.Client) (checkpoint, run string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.SetSecret(ctx, "tok", []byte("old-acme-secret-0123456789")); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Run(ctx, "echo hello > /root/f"); err != nil {
		t.Fatal(err)
	}
	ck, err := sb.Checkpoint(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.SaveTemplate(ctx, "tpl-old"); err != nil {
		t.Fatal(err)
	}
	runs, err := c.Runs(ctx, agentbox.RunQuery{Sandbox: sb.ID()})
	if err != nil || len(runs) == 0 {
		t.Fatalf("acme's runs: %v %v", runs, err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	return ck.ID, runs[0].ID
}

// TestAdversarialDurabilityTenantNameReuse deletes tenant acme and
// creates a new tenant of the same name: it must see nothing of the old
// tenant's (secrets, templates, checkpoints, runs), the old key must not
// work, and the admin finds none of it left over either. A tenant that
// still owns sandboxes is not deleted.
func TestAdversarialDurabilityTenantNameReuse(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	old, oldKey := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)
	ckID, runID := acmeObjects(t, old)

	// Refused while acme owns a sandbox.
	sb, err := old.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteTenant(ctx, "acme"); !agentbox.IsConflict(err) {
		t.Fatalf("deleting a tenant that owns a sandbox: %v, want a conflict", err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatalf("delete tenant acme: %v", err)
	}
	if st, _, _ := rawCall(t, base, oldKey.Key, http.MethodGet, "/v1/sandboxes", nil); st != http.StatusUnauthorized {
		t.Errorf("the deleted tenant's key: status %d, want 401", st)
	}

	// Someone else registers the name.
	c, _ := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)
	if secs, err := c.Secrets(ctx); err != nil || len(secs) != 0 {
		t.Errorf("the new acme inherits secrets: %+v %v", secs, err)
	}
	if tpls, err := c.Templates(ctx); err != nil {
		t.Error(err)
	} else {
		for _, tp := range tpls {
			if strings.Contains(tp.Name, "tpl-old") {
				t.Errorf("the new acme inherits template %+v", tp)
			}
		}
	}
	if _, err := c.Create(ctx, agentbox.SandboxSpec{Template: "tpl-old"}); err == nil {
		t.Errorf("the new acme creates sandboxes from the old acme's template")
	}
	if cks, err := c.Checkpoints(ctx); err != nil || len(cks) != 0 {
		t.Errorf("the new acme inherits checkpoints: %+v %v", cks, err)
	}
	if _, err := c.Checkpoint(ctx, ckID); !agentbox.IsNotFound(err) {
		t.Errorf("the new acme reads the old acme's checkpoint %s: %v", ckID, err)
	}
	if runs, err := c.Runs(ctx, agentbox.RunQuery{}); err != nil || len(runs) != 0 {
		t.Errorf("the new acme inherits run records: %d %v", len(runs), err)
	}
	if _, err := c.Run(ctx, runID); !agentbox.IsNotFound(err) {
		t.Errorf("the new acme reads the old acme's run %s: %v", runID, err)
	}
	// Nothing of the old tenant is left for the admin either.
	if secs, err := d.client.Secrets(ctx); err == nil {
		for _, s := range secs {
			if s.Tenant == "acme" {
				t.Errorf("the deleted tenant's secret is left: %+v", s)
			}
		}
	}
	if _, err := d.client.Checkpoint(ctx, ckID); !agentbox.IsNotFound(err) {
		t.Errorf("the deleted tenant's checkpoint %s is left: %v", ckID, err)
	}
	if _, err := d.client.Run(ctx, runID); !agentbox.IsNotFound(err) {
		t.Errorf("the deleted tenant's run record %s is left: %v", runID, err)
	}
}

// TestAdversarialDurabilityTenantDeleteTakesTriggers deletes a tenant
// that owns a schedule and a webhook: they go with it (and with them
// every way to create sandboxes in its name), instead of blocking the
// delete or surviving for a later tenant of the same name.
func TestAdversarialDurabilityTenantDeleteTakesTriggers(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	old, _ := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)
	sch, err := old.CreateSchedule(ctx, agentbox.CreateScheduleRequest{Cron: "0 0 1 1 *", RunAction: api.RunAction{Template: "busybox", Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := old.CreateHook(ctx, api.RunAction{Template: "busybox", Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatalf("delete tenant acme, which owns a schedule and a webhook: %v", err)
	}
	if _, err := d.client.Schedule(ctx, sch.ID); !agentbox.IsNotFound(err) {
		t.Errorf("the deleted tenant's schedule %s is left: %v", sch.ID, err)
	}
	if _, err := d.client.DeliverHook(ctx, hook.ID, hook.Secret, []byte("x"), true); err == nil {
		t.Errorf("the deleted tenant's webhook %s still runs", hook.ID)
	}
	c, _ := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)
	if s, err := c.Schedules(ctx); err != nil || len(s) != 0 {
		t.Errorf("the new acme inherits schedules: %+v %v", s, err)
	}
	if h, err := c.Hooks(ctx); err != nil || len(h) != 0 {
		t.Errorf("the new acme inherits webhooks: %+v %v", h, err)
	}
}

// TestAdversarialDurabilityMissedRunsAdmitted gives a tenant at its
// sandbox quota schedules whose missed slots run at daemon start-up:
// every such run must be refused by the quota (and recorded so), not run
// in a sandbox beyond the quota.
func TestAdversarialDurabilityMissedRunsAdmitted(t *testing.T) {
	d, base := tenancyDaemon(t)
	ctx := context.Background()
	c, _ := tenantClient(t, d, base, "acme", api.Quotas{MaxSandboxes: 1}, api.ScopeFull)
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	// Several schedules widen the start-up window for the old code.
	for i := 0; i < 4; i++ {
		if _, err := c.CreateSchedule(ctx, agentbox.CreateScheduleRequest{
			Cron: "@every 1h", MissedRunPolicy: api.MissedRunRunOnce,
			RunAction: api.RunAction{Template: "busybox", Command: "echo ran"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The slots pass while no daemon runs: the stored schedules are
	// rewritten to have been created two hours ago.
	d.stop(syscall.SIGTERM)
	backdateSchedules(t, d, 2*time.Hour)
	d.start()

	var runs []api.Run
	for deadline := time.Now().Add(30 * time.Second); ; {
		runs, err = d.client.Runs(ctx, agentbox.RunQuery{Trigger: api.TriggerSchedule})
		if err != nil {
			t.Fatal(err)
		}
		done := len(runs) >= 4
		for _, r := range runs {
			done = done && r.State != api.RunRunning
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(runs) != 4 {
		t.Fatalf("want 4 catch-up runs recorded, got %d: %+v", len(runs), runs)
	}
	for _, r := range runs {
		if r.State != api.RunFailed || !strings.Contains(r.Error, "quota") {
			t.Errorf("a missed run of a tenant at its sandbox quota was not refused by the quota: state %q exit %v error %q sandbox %s", r.State, r.ExitCode, r.Error, r.Sandbox)
		}
	}
}

// backdateSchedules moves the creation (and last slot) of every stored
// schedule of the stopped daemon d back by ago.
func backdateSchedules(t *testing.T, d *daemon, ago time.Duration) {
	t.Helper()
	st, err := store.Open(filepath.Join(d.dataDir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	scheds, err := st.ListSchedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range scheds {
		s.CreatedAt = s.CreatedAt.Add(-ago)
		if s.LastSlotAt != nil {
			v := s.LastSlotAt.Add(-ago)
			s.LastSlotAt = &v
		}
		if err := st.PutSchedule(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
}
