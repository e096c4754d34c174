package test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// gvisorPoolWait bounds a gvisor pool's fill: each pooled sandbox is a
// runsc sandbox started and paused, seconds each on a loaded machine.
const gvisorPoolWait = 3 * time.Minute

// runscStatus is runsc's status of container id of d's gvisor backend
// ("paused", "running"), "" when runsc does not know it.
func (d *daemon) runscStatus(t *testing.T, runsc, id string) string {
	t.Helper()
	root := filepath.Join(filepath.Dir(d.socket), "gvisor", "runsc")
	out, err := exec.Command(runsc, "--root="+root, "state", id).Output()
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(out, &st) != nil {
		return ""
	}
	return st.Status
}

// fromPool reports whether sb was handed out by a warm pool.
func fromPool(sb *agentbox.Sandbox) bool {
	lt := sb.Info().LastTransition
	return lt != nil && lt.Detail == "warm pool"
}

// TestPoolGvisor: a warm pool on gvisor (--warm-pool busybox:gvisor=2)
// fills with sandboxes paused by runsc; a create asking for gvisor claims
// one that answers exec at once, runs under the sentry, reports backend
// gvisor in inspect, and has an identity of its own (hostname, machine-id,
// random seed) per claim; the pool refills. A create for the other backend is never
// served from a pool of this one, both ways: native with only a gvisor
// pool, gvisor with only a native pool. Deleting a claimed sandbox leaves
// nothing on the host; a crashed daemon's pooled sandboxes are deleted by
// the next, which refills the pool; a clean shutdown deletes them.
func TestPoolGvisor(t *testing.T) {
	runsc := requiresRunsc(t)
	d := newDaemonWith(t, "--warm-pool", "busybox:gvisor=2")
	c := d.client
	ctx := context.Background()
	p := waitPoolOn(t, c, "busybox", "gvisor", 2, gvisorPoolWait)
	if p.Size != 2 || p.Claims != 0 {
		t.Fatalf("gvisor pool %+v", p)
	}
	pooled := sandboxDirs(t, d.dataDir)
	if len(pooled) != 2 {
		t.Fatalf("pooled sandbox dirs %v, want 2", pooled)
	}
	for _, id := range pooled {
		if st := d.runscStatus(t, runsc, id); st != "paused" {
			t.Errorf("pooled sandbox %s is %q in runsc, want paused", id, st)
		}
	}
	out, errOut, code := d.cli(t, "template", "pool")
	listed := false
	for _, l := range strings.Split(out, "\n") {
		listed = listed || slices.Equal(strings.Fields(l), []string{"busybox", "gvisor", "2", "2", "0", "0"})
	}
	if code != 0 || !listed {
		t.Errorf("template pool: exit %d %s\n%s; want a row busybox gvisor 2 2 0 0", code, errOut, out)
	}

	// Attack: with only a gvisor pool, a create that runs on native
	// must get a native sandbox, made fresh.
	nat := d.create(t, agentbox.SandboxSpec{})
	if nat.Info().Backend != "native" || fromPool(nat) || slices.Contains(pooled, nat.ID()) {
		t.Fatalf("native create with only a gvisor pool: %s on %q from pool %v", nat.ID(), nat.Info().Backend, fromPool(nat))
	}
	if got := mustRun(t, nat, "uname -r"); strings.Contains(got, "gvisor") {
		t.Fatalf("native create runs under the sentry: uname -r %q", got)
	}

	// Two claims: each from the pool, answering exec at once, under the
	// sentry, with an identity of its own.
	type ident struct{ hostname, machineID, seed string }
	var ids []ident
	var claimed []*agentbox.Sandbox
	for range 2 {
		sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor", Env: map[string]string{"WHO": "claimer"}})
		got := mustRun(t, sb, "hostname; cat /etc/machine-id; uname -r; echo $WHO; md5sum < /var/lib/systemd/random-seed")
		if !slices.Contains(pooled, sb.ID()) || !fromPool(sb) {
			t.Fatalf("gvisor create %s did not come from the pool %v", sb.ID(), pooled)
		}
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 5 || lines[0] != sb.ID() || len(lines[1]) != 32 || !strings.Contains(lines[2], "gvisor") || lines[3] != "claimer" || len(lines[4]) < 32 {
			t.Fatalf("claimed %s: hostname, machine-id, kernel, env, random seed digest = %q", sb.ID(), got)
		}
		if sb.Info().Backend != "gvisor" || sb.Info().State != api.StateRunning {
			t.Fatalf("claimed %s: %s on %q", sb.ID(), sb.Info().State, sb.Info().Backend)
		}
		out, _, _ := d.cli(t, "inspect", sb.ID())
		var infos []api.Sandbox
		if json.Unmarshal([]byte(out), &infos) != nil || len(infos) != 1 || infos[0].Backend != "gvisor" {
			t.Fatalf("inspect %s = %s; want backend gvisor", sb.ID(), out)
		}
		if st := d.runscStatus(t, runsc, sb.ID()); st != "running" {
			t.Fatalf("claimed %s is %q in runsc, want running", sb.ID(), st)
		}
		ids = append(ids, ident{lines[0], lines[1], lines[4]})
		claimed = append(claimed, sb)
	}
	if ids[0].hostname == ids[1].hostname || ids[0].machineID == ids[1].machineID || ids[0].seed == ids[1].seed {
		t.Fatalf("two claims share an identity: %+v", ids)
	}
	if tl, err := claimed[0].Transitions(ctx); err != nil || len(tl) != 1 {
		t.Fatalf("transitions of a claimed sandbox %+v, %v: pool bookkeeping shows", tl, err)
	}
	p = waitPoolOn(t, c, "busybox", "gvisor", 2, gvisorPoolWait)
	if p.Claims != 2 {
		t.Fatalf("claims %d, want 2", p.Claims)
	}

	// Deleting a claimed gvisor sandbox leaves nothing of it.
	gone := claimed[0].ID()
	if err := claimed[0].Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if left := d.gvisorLeft(t, runsc, gone); len(left) != 0 {
		t.Fatalf("deleted claimed sandbox %s left %v", gone, left)
	}

	// Attack, the reverse: with only a native pool, a create that runs on
	// gvisor must get a gvisor sandbox, made fresh.
	if _, err := c.SetPool(ctx, "busybox", 0, agentbox.PoolRuntime("gvisor")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetPool(ctx, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	natPool := waitPool(t, c, "busybox", 1)
	nativePooled := sandboxDirs(t, d.dataDir)
	gv := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	if gv.Info().Backend != "gvisor" || fromPool(gv) || slices.Contains(nativePooled, gv.ID()) {
		t.Fatalf("gvisor create with only a native pool: %s on %q from pool %v", gv.ID(), gv.Info().Backend, fromPool(gv))
	}
	if got := mustRun(t, gv, "uname -r"); !strings.Contains(got, "gvisor") {
		t.Fatalf("gvisor create does not run under the sentry: uname -r %q", got)
	}
	if p := waitPool(t, c, "busybox", 1); p.Claims != natPool.Claims {
		t.Fatalf("native pool claims %d after a gvisor create, want %d", p.Claims, natPool.Claims)
	}

	// A crash: the next daemon deletes the pooled sandboxes of the dead
	// one (gvisor's included: nothing of them left on the host) and
	// refills; the claimed gvisor sandbox lives on.
	if _, err := c.SetPool(ctx, "busybox", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetPool(ctx, "busybox", 2, agentbox.PoolRuntime("gvisor")); err != nil {
		t.Fatal(err)
	}
	waitPoolOn(t, c, "busybox", "gvisor", 2, gvisorPoolWait)
	live := []string{nat.ID(), claimed[1].ID(), gv.ID()}
	var deadPooled []string
	for _, id := range sandboxDirs(t, d.dataDir) {
		if !slices.Contains(live, id) {
			deadPooled = append(deadPooled, id)
		}
	}
	d.restart(syscall.SIGKILL)
	c = d.client
	p = waitPoolOn(t, c, "busybox", "gvisor", 2, gvisorPoolWait)
	if p.Claims != 0 {
		t.Fatalf("pool after restart: %+v", p)
	}
	for _, id := range deadPooled {
		if left := d.gvisorLeft(t, runsc, id); len(left) != 0 {
			t.Fatalf("pooled sandbox %s of the dead daemon left %v", id, left)
		}
	}
	after := sandboxDirs(t, d.dataDir)
	if len(after) != len(live)+2 {
		t.Fatalf("sandbox dirs after restart %v, want %v and 2 pooled", after, live)
	}
	if got := mustRun(t, claimed[1], "hostname"); got != claimed[1].ID()+"\n" {
		t.Fatalf("claimed gvisor sandbox after restart: %q", got)
	}
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	if !fromPool(sb) || sb.Info().Backend != "gvisor" || mustRun(t, sb, "hostname") != sb.ID()+"\n" {
		t.Fatalf("claim after restart: %s on %q from pool %v", sb.ID(), sb.Info().Backend, fromPool(sb))
	}

	// A clean shutdown deletes the pooled sandboxes, runsc's included.
	var pooledNow []string
	for _, id := range sandboxDirs(t, d.dataDir) {
		if !slices.Contains(live, id) && id != sb.ID() {
			pooledNow = append(pooledNow, id)
		}
	}
	d.stop(syscall.SIGTERM)
	for _, id := range pooledNow {
		if left := d.gvisorLeft(t, runsc, id); len(left) != 0 {
			t.Fatalf("pooled sandbox %s left after a clean shutdown: %v", id, left)
		}
	}
	if left := sandboxDirs(t, d.dataDir); len(left) != len(live)+1 {
		t.Fatalf("sandbox dirs after shutdown %v, want the %d claimed or made", left, len(live)+1)
	}
	d.start()
}

// TestPoolTemplateRuntime: the pool of a template whose runtime is gvisor
// is, unless told otherwise, a gvisor pool; a create of the template
// naming no backend claims from it, one asking for native does not.
func TestPoolTemplateRuntime(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	c := d.client
	ctx := context.Background()
	if _, err := c.BuildTemplate(ctx, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name: "sentried", Base: "busybox", Runtime: "gvisor",
	}}, nil); err != nil {
		t.Fatal(err)
	}
	p, err := c.SetPool(ctx, "sentried", 1)
	if err != nil || p.Runtime != "gvisor" {
		t.Fatalf("pool of a gvisor template: %+v, %v; want runtime gvisor", p, err)
	}
	waitPoolOn(t, c, "sentried", "gvisor", 1, gvisorPoolWait)
	nat := d.create(t, agentbox.SandboxSpec{Template: "sentried", Runtime: "native"})
	if nat.Info().Backend != "native" || fromPool(nat) {
		t.Fatalf("native create of a gvisor template with a gvisor pool: %s on %q from pool %v", nat.ID(), nat.Info().Backend, fromPool(nat))
	}
	sb := d.create(t, agentbox.SandboxSpec{Template: "sentried"})
	if sb.Info().Backend != "gvisor" || !fromPool(sb) || !strings.Contains(mustRun(t, sb, "uname -r"), "gvisor") {
		t.Fatalf("create of a gvisor template: %s on %q from pool %v", sb.ID(), sb.Info().Backend, fromPool(sb))
	}
}
