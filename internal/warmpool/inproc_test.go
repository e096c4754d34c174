package warmpool_test

// The feature on a real Manager and guests (sandboxtest, the in-process
// backend): a pool fills with hidden, paused sandboxes that creates claim.

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/warmpool"
)

func pool(t *testing.T, k *warmpool.Keeper, name string) api.Pool {
	t.Helper()
	ps, err := k.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Template == name {
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
	if _, err := k.SetPool(ctx, "base", 2); err != nil {
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
		if _, err := k.SetPool(ctx, bad.name, bad.size); err == nil {
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
	if _, err := k2.SetPool(ctx, "base", 0); err != nil {
		t.Fatal(err)
	}
	k2.DrainPools(ctx)
	if ps, _ := k2.Pools(ctx); len(ps) != 0 {
		t.Fatalf("pools after drain: %+v", ps)
	}
}
