package warmpool_test

// The feature on a real Manager and guests (sandboxtest, the in-process
// backend): a pool fills with hidden, paused sandboxes that creates claim.

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/inproc"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/warmpool"
)

// pool is the state of template name's pool on the default backend.
func pool(t *testing.T, k *warmpool.Keeper, name string) api.Pool {
	t.Helper()
	return poolOn(t, k, name, inproc.Name)
}

// poolOn is the state of template name's pool on backend rt.
func poolOn(t *testing.T, k *warmpool.Keeper, name, rt string) api.Pool {
	t.Helper()
	ps, err := k.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Template == name && p.Runtime == rt {
			return p
		}
	}
	return api.Pool{}
}

// attach gives the Manager the Env builds next a Keeper of its own, as a
// (re)started daemon does, and returns it.
func attach(e *sandboxtest.Env, c *sandbox.Config) *warmpool.Keeper {
	k := warmpool.New(warmpool.Config{DataDir: c.DataDir})
	c.Extensions = []sandbox.Extension{k}
	return k
}

// A warm pool fills with paused sandboxes that creates claim; it refills,
// survives a restart and drains.
func TestInprocWarmPool(t *testing.T) {
	var k *warmpool.Keeper
	h := sandboxtest.New(t, func(e *sandboxtest.Env, c *sandbox.Config) { k = attach(e, c) })
	ctx := sandboxtest.Context(t)
	if _, err := k.SetPool(ctx, "base", "", 2); err != nil {
		t.Fatal(err)
	}
	sandboxtest.WaitFor(t, "the pool to fill", func() bool { return pool(t, k, "base").Ready == 2 })
	if l, _ := h.M.ListSandboxes(ctx, nil); len(l) != 0 {
		t.Fatalf("pooled sandboxes are listed: %+v", l)
	}
	sb := h.Create(api.CreateSandboxRequest{Labels: map[string]string{"from": "pool"}, Env: map[string]string{"X": "y"}})
	if sb.State != api.StateRunning || sb.Labels["from"] != "pool" {
		t.Fatalf("claimed %+v", sb)
	}
	if p := pool(t, k, "base"); p.Claims != 1 {
		t.Fatalf("pool after a claim: %+v", p)
	}
	if r := h.Exec(sb.ID, api.ExecRequest{Command: "echo $X"}); r.Stdout != "y\n" {
		t.Fatalf("exec in a claimed sandbox = %+v", r)
	}
	sandboxtest.WaitFor(t, "the pool to refill", func() bool { return pool(t, k, "base").Ready == 2 })
	for _, bad := range []struct {
		name string
		size int
	}{{"Bad Name", 1}, {"base", -1}, {"missing", 1}} {
		if _, err := k.SetPool(ctx, bad.name, "", bad.size); err == nil {
			t.Errorf("SetPool(%q, %d) succeeded", bad.name, bad.size)
		}
	}
	if err := k.SetPools(ctx, map[string]int{"base": 5, "Bad Name": 1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("SetPools with a bad name: %v", err)
	}

	// A restarted daemon: a new Manager with a new Keeper; recovery first,
	// then the pools start (SetPools), with the size set through the API.
	h.M.Close()
	k2 := attach(h, &h.Config)
	m2 := h.Manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	// The earlier daemon's pooled sandboxes are gone; the claimed one stays.
	if recs, err := h.Store.ListSandboxes(ctx); err != nil || len(recs) != 1 || recs[0].Sandbox.ID != sb.ID {
		t.Fatalf("records after restart: %d, %v", len(recs), err)
	}
	if err := k2.SetPools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if p := pool(t, k2, "base"); p.Size != 2 {
		t.Fatalf("pool after restart: %+v", p)
	}
	sandboxtest.WaitFor(t, "the recovered pool to be ready", func() bool { return pool(t, k2, "base").Ready == 2 })
	if _, err := k2.SetPool(ctx, "base", "", 0); err != nil {
		t.Fatal(err)
	}
	k2.DrainPools(ctx)
	if ps, _ := k2.Pools(ctx); len(ps) != 0 {
		t.Fatalf("pools after drain: %+v", ps)
	}
}

// fromPool reports whether sb was handed out by a pool.
func fromPool(sb api.Sandbox) bool {
	return sb.LastTransition != nil && sb.LastTransition.Detail == "warm pool"
}

// Pools are per template and backend: a create is served only from the
// pool of the backend it runs on. A create asking for the other backend
// never gets a pooled sandbox of this one, in either direction.
func TestInprocPoolPerBackend(t *testing.T) {
	const other = "sentry" // a second backend, as gvisor beside native
	var k *warmpool.Keeper
	h := sandboxtest.New(t, func(e *sandboxtest.Env, c *sandbox.Config) {
		k = attach(e, c)
		e.Others = []runtime.Backend{inproc.New(inproc.Config{Name: other, Version: "guest-test"})}
	})
	ctx := sandboxtest.Context(t)
	if p, err := k.SetPool(ctx, "base", "", 1); err != nil || p.Runtime != inproc.Name {
		t.Fatalf("pool on the default backend: %+v, %v", p, err)
	}
	sandboxtest.WaitFor(t, "the default pool to fill", func() bool { return pool(t, k, "base").Ready == 1 })

	// Only the default backend has a pool: a create on the other one is
	// made fresh, there.
	sb := h.Create(api.CreateSandboxRequest{Runtime: other})
	if sb.Backend != other || fromPool(sb) {
		t.Fatalf("create on %s with only a %s pool: backend %s, %+v", other, inproc.Name, sb.Backend, sb.LastTransition)
	}
	if p := pool(t, k, "base"); p.Claims != 0 || p.Ready != 1 {
		t.Fatalf("the %s pool after a create on %s: %+v", inproc.Name, other, p)
	}

	// Only the other backend has a pool: a create on the default is made
	// fresh, on the default.
	if _, err := k.SetPool(ctx, "base", "", 0); err != nil {
		t.Fatal(err)
	}
	if p, err := k.SetPool(ctx, "base", other, 1); err != nil || p.Runtime != other {
		t.Fatalf("pool on %s: %+v, %v", other, p, err)
	}
	sandboxtest.WaitFor(t, "the other pool to fill", func() bool { return poolOn(t, k, "base", other).Ready == 1 })
	sb = h.Create(api.CreateSandboxRequest{})
	if sb.Backend != inproc.Name || fromPool(sb) {
		t.Fatalf("default create with only a %s pool: backend %s, %+v", other, sb.Backend, sb.LastTransition)
	}
	if p := poolOn(t, k, "base", other); p.Claims != 0 || p.Ready != 1 {
		t.Fatalf("the %s pool after a default create: %+v", other, p)
	}

	// Both have pools: each create is served from its backend's.
	if _, err := k.SetPool(ctx, "base", inproc.Name, 1); err != nil {
		t.Fatal(err)
	}
	sandboxtest.WaitFor(t, "both pools to fill", func() bool { return pool(t, k, "base").Ready == 1 })
	a := h.Create(api.CreateSandboxRequest{Runtime: other})
	b := h.Create(api.CreateSandboxRequest{})
	if a.Backend != other || !fromPool(a) || b.Backend != inproc.Name || !fromPool(b) {
		t.Fatalf("claims: %s on %s (%+v), %s on %s (%+v)", a.ID, a.Backend, a.LastTransition, b.ID, b.Backend, b.LastTransition)
	}
	if pool(t, k, "base").Claims != 1 || poolOn(t, k, "base", other).Claims != 1 {
		t.Fatalf("claims per pool: %+v %+v", pool(t, k, "base"), poolOn(t, k, "base", other))
	}
	if r := h.Exec(a.ID, api.ExecRequest{Command: "echo ok"}); r.Stdout != "ok\n" {
		t.Fatalf("exec in the claimed %s sandbox = %+v", other, r)
	}
	if _, err := k.SetPool(ctx, "base", "nope", 1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pool on an unknown backend: %v", err)
	}
}
