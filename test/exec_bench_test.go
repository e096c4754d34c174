package test

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// BenchmarkExecRoundTrip is one exec of /bin/true through the daemon, from
// request to exit event: the per-exec cost (a cgroup per exec, the fork on
// the shared Landlock domain's thread).
func BenchmarkExecRoundTrip(b *testing.B) {
	benchExec(b, false)
}

// BenchmarkExecPrivate is BenchmarkExecRoundTrip for a private exec (a
// fresh Landlock domain and OS thread per exec).
func BenchmarkExecPrivate(b *testing.B) {
	benchExec(b, true)
}

func benchExec(b *testing.B, private bool) {
	d := newDaemon(b)
	sb := d.create(b, agentbox.SandboxSpec{})
	ctx := context.Background()
	req := api.ExecRequest{Cmd: []string{"/bin/true"}, Private: private}
	b.ResetTimer()
	for range b.N {
		res, err := sb.Exec(ctx, req, agentbox.Streams{})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
	}
}
