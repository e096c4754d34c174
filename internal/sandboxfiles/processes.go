package sandboxfiles

import (
	"context"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
)

// ListProcesses lists the processes started through exec (observed as
// "listing processes").
func (f *Files) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	var out []api.Process
	err := f.g.WithGuest(ctx, id, "listing processes", func(g *client.Client) (err error) {
		out, err = g.Processes(ctx)
		return err
	})
	return out, err
}

// SoleProcess reports whether pid is the one process started through exec
// that is running in sandbox id: what attributes a connection the sandbox
// makes (to the egress proxy, say) to the run of that process when the
// connection carries no run token. False when the list cannot be read.
func (f *Files) SoleProcess(ctx context.Context, id string, pid int) bool {
	procs, err := f.ListProcesses(ctx, id)
	if err != nil {
		return false
	}
	running := 0
	for _, p := range procs {
		if !p.Running {
			continue
		}
		running++
		if p.Pid != pid || running > 1 {
			return false
		}
	}
	return running == 1
}

// WriteStdin copies r to a process's stdin, closing it afterwards when
// closeAfter is set (observed as "writing stdin of process <pid>").
func (f *Files) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	return f.g.WithGuest(ctx, id, fmt.Sprintf("writing stdin of process %d", pid), func(g *client.Client) error {
		return g.WriteStdin(ctx, pid, r, closeAfter)
	})
}

// Signal sends a signal to a process's group (observed as "signalling
// process <pid>").
func (f *Files) Signal(ctx context.Context, id string, pid int, sig string) error {
	return f.g.WithGuest(ctx, id, fmt.Sprintf("signalling process %d", pid), func(g *client.Client) error {
		return g.Signal(ctx, pid, sig)
	})
}

// Resize changes a process's terminal size (observed as "resizing
// process <pid>").
func (f *Files) Resize(ctx context.Context, id string, pid int, tty api.TTY) error {
	return f.g.WithGuest(ctx, id, fmt.Sprintf("resizing process %d", pid), func(g *client.Client) error {
		return g.Resize(ctx, pid, tty)
	})
}
