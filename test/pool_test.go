package test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// waitPool waits until template's pool on the default backend (native)
// has ready sandboxes ready.
func waitPool(t testing.TB, c *agentbox.Client, template string, ready int) api.Pool {
	t.Helper()
	return waitPoolOn(t, c, template, "native", ready, time.Minute)
}

// waitPoolOn waits up to limit until template's pool on backend rt has
// ready sandboxes ready.
func waitPoolOn(t testing.TB, c *agentbox.Client, template, rt string, ready int, limit time.Duration) api.Pool {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		pools, err := c.Pools(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pools {
			if p.Template == template && p.Runtime == rt && p.Ready == ready && p.Filling == 0 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s on %s never had %d ready: %+v", template, rt, ready, pools)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sandboxDirs lists the sandbox directories of the data dir (pooled ones
// included).
func sandboxDirs(t testing.TB, dataDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// A create of a pooled template claims a paused sandbox: it works, has a
// fresh identity (hostname = its id, a machine-id of its own), the
// request's env and labels, and a transition log that starts at its
// create; pooled sandboxes are not listed or reachable by id; the pool
// refills; creates with other resources bypass it.
func TestPoolClaim(t *testing.T) {
	d := newDaemonWith(t, "--warm-pool", "busybox=2")
	c := d.client
	ctx := context.Background()
	waitPool(t, c, "busybox", 2)
	pooled := sandboxDirs(t, d.dataDir)
	if len(pooled) != 2 {
		t.Fatalf("pooled sandbox dirs %v, want 2", pooled)
	}
	if sbs, err := c.List(ctx, nil); err != nil || len(sbs) != 0 {
		t.Fatalf("ls with only pooled sandboxes: %d, %v", len(sbs), err)
	}
	for _, id := range pooled {
		if _, err := c.Get(ctx, id); !agentbox.IsNotFound(err) {
			t.Fatalf("get pooled %s: %v, want not found", id, err)
		}
		if code, _ := d.rawRequest(t, "POST", "/v1/sandboxes/"+id+"/exec", []byte(`{"command":"true"}`)); code != 404 {
			t.Fatalf("exec in pooled %s: %d, want 404", id, code)
		}
	}

	a := d.create(t, agentbox.SandboxSpec{Env: map[string]string{"WHO": "a"}, Labels: map[string]string{"k": "v"}})
	b := d.create(t, agentbox.SandboxSpec{})
	for _, sb := range []*agentbox.Sandbox{a, b} {
		if !slices.Contains(pooled, sb.ID()) {
			t.Fatalf("sandbox %s did not come from the pool %v", sb.ID(), pooled)
		}
		info := sb.Info()
		if info.State != api.StateRunning {
			t.Fatalf("claimed: %+v", info)
		}
		if lt := info.LastTransition; lt == nil || lt.From != api.StateCreating || lt.Cause != api.CauseCreate {
			t.Fatalf("last transition %+v", lt)
		}
		tl, err := sb.Transitions(ctx)
		if err != nil || len(tl) != 1 {
			t.Fatalf("transitions %+v, %v: pool bookkeeping shows", tl, err)
		}
	}
	if got := mustRun(t, a, "hostname; echo $WHO"); got != a.ID()+"\na\n" {
		t.Fatalf("hostname, env = %q", got)
	}
	if a.Info().Labels["k"] != "v" {
		t.Fatalf("labels %v", a.Info().Labels)
	}
	ma := mustRun(t, a, "cat /etc/machine-id")
	mb := mustRun(t, b, "cat /etc/machine-id")
	if len(strings.TrimSpace(ma)) != 32 || ma == mb {
		t.Fatalf("machine ids %q %q", ma, mb)
	}
	mustRun(t, a, "echo data > /root/f && cat /root/f")

	// The pool refills with new sandboxes.
	p := waitPool(t, c, "busybox", 2)
	if p.Claims != 2 {
		t.Fatalf("claims %d, want 2", p.Claims)
	}
	refilled := sandboxDirs(t, d.dataDir)
	if len(refilled) != 4 {
		t.Fatalf("sandbox dirs after refill %v", refilled)
	}
	// Non-default resources bypass the pool.
	big := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{PidsMax: 77}})
	if slices.Contains(refilled, big.ID()) || big.Info().Resources.PidsMax != 77 {
		t.Fatalf("custom create came from the pool: %+v", big.Info())
	}
	if lt := big.Info().LastTransition; lt == nil || lt.Detail == "warm pool" {
		t.Fatalf("custom create: %+v", big.Info().LastTransition)
	}
	// Nothing of the pool inside: the same processes and environment as in
	// a sandbox made fresh.
	const look = "ps -o comm; env | grep -v -e ^AGENTBOX_RUN_ID= -e ^HOSTNAME= | sort"
	if got, want := mustRun(t, b, look), mustRun(t, big, look); got != want {
		t.Fatalf("claimed sandbox differs inside from a fresh one:\n%s\nvs\n%s", got, want)
	}
	if p := waitPool(t, c, "busybox", 2); p.Claims != 2 {
		t.Fatalf("claims %d after a bypass", p.Claims)
	}

	// Shrinking removes pooled sandboxes; the API size outlives a restart.
	if _, err := c.SetPool(ctx, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "busybox", 1)
	if n := len(sandboxDirs(t, d.dataDir)); n != 4 { // a, b, big, one pooled
		t.Fatalf("sandbox dirs after shrink: %d", n)
	}
}

// After a crash the pooled sandboxes of the dead daemon are deleted and
// the pool is refilled with new ones; claimed sandboxes are kept; a clean
// shutdown deletes the pooled sandboxes.
func TestPoolRestart(t *testing.T) {
	d := newDaemonWith(t, "--warm-pool", "busybox=2")
	c := d.client
	ctx := context.Background()
	waitPool(t, c, "busybox", 2)
	claimed := d.create(t, agentbox.SandboxSpec{})
	waitPool(t, c, "busybox", 2)
	// An API size wins over the flag after a restart.
	if _, err := c.SetPool(ctx, "busybox", 3); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, "busybox", 3)
	before := sandboxDirs(t, d.dataDir)

	d.restart(syscall.SIGKILL)
	c = d.client
	waitPool(t, c, "busybox", 3)
	after := sandboxDirs(t, d.dataDir)
	if len(after) != 4 || !slices.Contains(after, claimed.ID()) {
		t.Fatalf("after restart: %v (claimed %s)", after, claimed.ID())
	}
	for _, id := range before {
		if id != claimed.ID() && slices.Contains(after, id) {
			t.Fatalf("pooled sandbox %s of the dead daemon survived", id)
		}
	}
	if got := mustRun(t, claimed, "hostname"); got != claimed.ID()+"\n" {
		t.Fatalf("claimed after restart: %q", got)
	}
	if err := claimed.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	d.stop(syscall.SIGTERM)
	if left := sandboxDirs(t, d.dataDir); len(left) != 0 {
		t.Fatalf("pooled sandboxes left after shutdown: %v", left)
	}
	d.start()
}
