package native

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// BenchmarkCreateDestroy measures a full sandbox lifecycle: create, guest
// ready (socket answering a command), destroy.
func BenchmarkCreateDestroy(b *testing.B) {
	layer := runtimetest.SharedLayer(b)
	runner := runtimetest.RunnerDir(b)
	be := newBackendTB(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		spec := runtimetest.NewSpec(b, fmt.Sprintf("bench-%d", i), layer, runner)
		b.StartTimer()
		sb, err := be.Create(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if _, code, err := runtimetest.Exec(spec.SocketPath, "true", 10e9); err != nil || code != 0 {
			b.Fatalf("exec: %v %d", err, code)
		}
		if err := sb.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateReady measures create until the guest answers its first
// command, cold and with a prespawned guest; destroy is not timed.
func BenchmarkCreateReady(b *testing.B) {
	for _, mode := range []string{"cold", "prespawn"} {
		b.Run(mode, func(b *testing.B) {
			layer := runtimetest.SharedLayer(b)
			runner := runtimetest.RunnerDir(b)
			be := newBackendTB(b)
			if mode == "prespawn" {
				be = prespawnBackend(b, runner)
			}
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				spec := runtimetest.NewSpec(b, fmt.Sprintf("bench-%s-%d", mode, i), layer, runner)
				if mode == "prespawn" {
					waitZygote(b, be)
				}
				b.StartTimer()
				sb, err := be.Create(ctx, spec)
				if err != nil {
					b.Fatal(err)
				}
				if _, code, err := runtimetest.Exec(spec.SocketPath, "true", 10e9); err != nil || code != 0 {
					b.Fatalf("exec: %v %d", err, code)
				}
				b.StopTimer()
				if err := sb.Destroy(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
