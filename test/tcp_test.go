package test

import (
	"context"
	"testing"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestTCPListenerNeedsAPIKey: the optional TCP listener serves the same API,
// but only to requests carrying one of the configured API keys.
func TestTCPListenerNeedsAPIKey(t *testing.T) {
	d, addr, key := tcpDaemon(t)
	ctx := context.Background()

	anon, err := agentbox.New(agentbox.WithHost("http://" + addr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.List(ctx, nil); !agentbox.IsUnauthenticated(err) {
		t.Fatalf("list without a key: %v, want unauthenticated", err)
	}
	wrong, _ := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key+"x"))
	if _, err := wrong.List(ctx, nil); !agentbox.IsUnauthenticated(err) {
		t.Fatalf("list with a wrong key: %v, want unauthenticated", err)
	}
	c, _ := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key))
	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatalf("create over TCP: %v", err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))
	res, err := sb.Run(ctx, "echo $((6*7))")
	if err != nil || string(res.Stdout) != "42\n" {
		t.Fatalf("run over TCP: %v %+v", err, res)
	}
	// The same sandbox is visible on the unix socket: one daemon, one state.
	if got, err := d.client.Get(ctx, sb.ID()); err != nil || got.ID() != sb.ID() {
		t.Fatalf("sandbox on the unix socket: %v", err)
	}
}
