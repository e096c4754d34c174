package runsecrets

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/sandboxfiles"
)

// Attributing egress connections to runs.
//
// A connection reaches the egress proxy over the sandbox's tunnel, which
// proves the sandbox but not the process: the guest's relay sees only a
// loopback peer. Finding the process would mean matching the peer's socket
// inode in /proc/net/tcp against every process's fds inside the sandbox
// and walking its parents up to an exec'd process, for every connection,
// in a guest we do not trust anyway. We chose a cheap rule instead: a
// connection belongs to run R when R is the only live run (exec with a run
// token; the only execs that have a run id) of the sandbox AND the guest
// reports R's process as the only running exec'd process. With two runs,
// or a run beside any other running exec (a background server, an exec
// without a token), the record's run id stays empty. Known gap: a daemon
// process left behind by an earlier, finished exec (reparented to the
// guest) is not an exec'd process, so its connections made during R are
// labelled R. The guest answers the process list, so a compromised guest
// can mislabel its own sandbox's records, nothing more; the label is
// bookkeeping, never an input to a policy or authorization decision.

// runAttrTimeout bounds the guest round trip of ActiveRun.
const runAttrTimeout = 2 * time.Second

// ActiveRun returns the id of the run a new egress connection of sandbox id
// is attributed to, or "" (see above). It costs a guest round trip only
// when exactly one run of the sandbox is live.
func (m *Secrets) ActiveRun(ctx context.Context, id string) string {
	now := time.Now()
	var only *run
	m.mu.Lock()
	for _, r := range m.runs {
		if r.sandbox != id || now.After(r.expires) {
			continue
		}
		if only != nil {
			m.mu.Unlock()
			return ""
		}
		only = r
	}
	m.mu.Unlock()
	if only == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, runAttrTimeout)
	defer cancel()
	// The process may have connected before the exec call returned its
	// pid to the Manager.
	select {
	case <-only.started:
	case <-ctx.Done():
		return ""
	}
	m.mu.Lock()
	pid := only.pid
	m.mu.Unlock()
	if !sandboxfiles.New(m.core).SoleProcess(ctx, id, pid) {
		return ""
	}
	return only.id
}

// setRunPid records the pid of r's process (in the sandbox's pid
// namespace).
func (m *Secrets) setRunPid(r *run, pid int) {
	if r == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.pid == 0 && pid > 0 {
		r.pid = pid
		close(r.started)
	}
}
