package sandbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/validate"
)

var _ execstream.Stream = (*client.Stream)(nil)

func (m *Manager) execRequest(b *box, req api.ExecRequest) (api.ExecRequest, error) {
	if (len(req.Cmd) == 0) == (req.Command == "") {
		return req, fmt.Errorf("exactly one of cmd or command is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := validate.Env(req.Env); err != nil {
		return req, err
	}
	if req.TimeoutSeconds < 0 {
		return req, fmt.Errorf("timeout_seconds must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	return req, nil
}

// mergeEnv puts b's environment under req.Env.
func mergeEnv(b *box, req *api.ExecRequest) {
	b.mu.Lock()
	env := cloneMap(b.rec.Sandbox.Env)
	b.mu.Unlock()
	if env == nil {
		env = make(map[string]string, len(req.Env))
	}
	for k, v := range req.Env {
		env[k] = v
	}
	req.Env = env
}

// Exec starts a process in the sandbox and streams its events. A request
// with CheckpointBefore or RollbackOnFailure is refused with
// ErrFailedPrecondition: exec transactions are the checkpoint feature's
// (snapshot.Snapshots.Exec), which clears both before it calls Exec.
func (m *Manager) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	if req.CheckpointBefore || req.RollbackOnFailure {
		// Exec transactions are the checkpoint feature's
		// (internal/snapshot), which clears both before it calls Exec:
		// never run a command without the checkpoint it asked for.
		return nil, fmt.Errorf("exec in sandbox %s: checkpoint_before and rollback_on_failure need exec transactions, not configured: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := m.admitExec(ctx, id); err != nil {
		return nil, err
	}
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	req, err = m.execRequest(b, req)
	if err != nil {
		return nil, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	req.Background = false
	s, err := m.exec(ctx, b, req)
	m.observeBox(ctx, OpExec, b, commandOf(req), err)
	if err != nil {
		return nil, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	return m.holdStream(b, s), nil
}

// exec runs req through the exec wrappers and starts it in b's guest.
func (m *Manager) exec(ctx context.Context, b *box, req api.ExecRequest) (execstream.Stream, error) {
	chain, err := m.wrapExecChecked(ctx, b, &req)
	if err != nil {
		return nil, err
	}
	mergeEnv(b, &req)
	s, err := b.guest.Exec(ctx, req)
	if err != nil {
		chain.abort()
		return nil, err
	}
	return chain.started(s.Pid(), s), nil
}

// commandOf describes req's command for observers (never its
// environment).
func commandOf(req api.ExecRequest) string {
	if req.Command != "" {
		return req.Command
	}
	return strings.Join(req.Cmd, " ")
}

// StartProcess starts a background process and returns at once.
func (m *Manager) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	if req.CheckpointBefore || req.RollbackOnFailure {
		return api.Process{}, fmt.Errorf("starting process in sandbox %s: checkpoint_before and rollback_on_failure need a foreground exec: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := m.admitExec(ctx, id); err != nil {
		return api.Process{}, err
	}
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return api.Process{}, err
	}
	defer release()
	req, err = m.execRequest(b, req)
	if err != nil {
		return api.Process{}, fmt.Errorf("starting process in sandbox %s: %w", id, err)
	}
	req.Background = true
	p, err := m.startProcess(ctx, b, req)
	m.observeBox(ctx, OpStartProcess, b, commandOf(req), err)
	if err != nil {
		return api.Process{}, fmt.Errorf("starting process in sandbox %s: %w", id, err)
	}
	return p, nil
}

// startProcess runs req through the exec wrappers and starts it in b's
// guest in the background.
func (m *Manager) startProcess(ctx context.Context, b *box, req api.ExecRequest) (api.Process, error) {
	chain, err := m.wrapExecChecked(ctx, b, &req)
	if err != nil {
		return api.Process{}, err
	}
	mergeEnv(b, &req)
	p, err := b.guest.Start(ctx, req)
	if err != nil {
		chain.abort()
		return api.Process{}, err
	}
	chain.started(p.Pid, nil)
	return p, nil
}

// Attach streams a process's output (replaying what it buffered when
// replay is set) until it exits.
func (m *Manager) Attach(ctx context.Context, id string, pid int, replay bool) (execstream.Stream, error) {
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	s, err := b.guest.Attach(ctx, pid, replay)
	m.observeBox(ctx, OpAttach, b, strconv.Itoa(pid), err)
	if err != nil {
		return nil, fmt.Errorf("attaching to process %d in sandbox %s: %w", pid, id, err)
	}
	return m.holdStream(b, m.wrapStream(b, pid, s)), nil
}

// WithGuest runs fn against the guest of sandbox id, as the caller of ctx
// sees it (ErrNotFound for another tenant's, a hidden or an unknown
// sandbox). It is how operations that are one guest call (files, stdin,
// signals, resize, the process list; internal/sandboxfiles) reach a
// sandbox:
//   - a sleeping sandbox is woken first (paused: thawed; hibernated:
//     started again) and the call counts as activity (the idle timer
//     restarts when it returns);
//   - fn runs with the sandbox's operation lock held shared, so it runs
//     concurrently with other calls and execs but never with a pause,
//     hibernate, restore, upgrade or delete of that sandbox; fn must not
//     call a Manager method that takes that lock exclusively, and must
//     not keep g past its return (a stream it opened may outlive it);
//   - observers see one Op of kind OpGuestCall with Detail op and fn's
//     error, once fn returns (not when the sandbox could not be acquired);
//   - fn's error is returned wrapped as "<op> in sandbox <id>: %w", so
//     errdefs categories survive; an acquire error is returned as is.
//
// Each call is independent: a repeated call runs fn again.
func (m *Manager) WithGuest(ctx context.Context, id, op string, fn func(g *client.Client) error) error {
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	err = fn(b.guest)
	m.observeBox(ctx, OpGuestCall, b, op, err)
	if err != nil {
		return fmt.Errorf("%s in sandbox %s: %w", op, id, err)
	}
	return nil
}
