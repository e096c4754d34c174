package runtimetest

import (
	"context"
	"errors"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// The cases below check what runtime.Backend's doc says of the corners of
// Create: an id that exists, and a context that ends during it.

// testCreateExistingID: a Create of an id whose guest runs is
// ErrAlreadyExists, from this backend instance or another (a restarted
// daemon's), and leaves that sandbox working; once it is destroyed, the id
// may be created again.
func testCreateExistingID(t *testing.T, f Fixture) {
	ctx := context.Background()
	b := f.NewBackend(t)
	spec := NewSpec(t, NewID("dup"), f.Layer, f.RunnerDir)
	sb := Create(t, b, spec)
	for name, be := range map[string]runtime.Backend{"same backend": b, "another instance": f.NewBackend(t)} {
		if dup, err := be.Create(ctx, spec); !errdefs.IsAlreadyExists(err) {
			if err == nil {
				_ = dup.Destroy(ctx)
			}
			t.Errorf("%s: Create of an existing id = %v, want ErrAlreadyExists", name, err)
		}
	}
	if out, code := MustExec(t, spec.SocketPath, "echo still"); code != 0 || out != "still\n" {
		t.Errorf("the existing sandbox after the refused Creates: exec = %q, %d", out, code)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	again := Create(t, b, spec)
	if out, code := MustExec(t, again.SocketPath(), "echo again"); code != 0 || out != "again\n" {
		t.Errorf("the id created again: exec = %q, %d", out, code)
	}
}

// testCreateCancelled: a Create whose context has ended either completes
// (the guest's report won the race) or fails with the context's error,
// leaving nothing behind.
func testCreateCancelled(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	spec := NewSpec(t, NewID("cnc"), f.Layer, f.RunnerDir)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sb, err := b.Create(ctx, spec)
	if err == nil {
		t.Log("Create completed before it saw its context end")
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		AssertGone(t, f, sb, spec)
		return
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Create with a cancelled context = %v, want context.Canceled", err)
	}
	AssertGone(t, f, nil, spec)
}
