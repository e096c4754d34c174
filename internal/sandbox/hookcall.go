package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// How the core calls the extension points of hooks.go.

// hooks are the extensions' hooks, by kind, in registration order. They
// are set by New and never change.
type hooks struct {
	prepare   []namedHook[PrepareHook]
	create    []namedHook[CreateHook]
	start     []namedHook[StartHook]
	stop      []namedHook[StopHook]
	recover   []namedHook[RecoverHook]
	delete    []namedHook[DeleteHook]
	purge     []namedHook[PurgeHook]
	exec      []namedHook[ExecWrapper]
	stream    []namedHook[StreamWrapper]
	intercept []namedHook[CreateInterceptor]
	observers []Observer
}

type namedHook[T any] struct {
	name string
	h    T
}

// collectHooks sorts exts into hooks.
func collectHooks(exts []Extension) (hooks, error) {
	var hs hooks
	seen := map[string]bool{}
	for _, e := range exts {
		if e == nil {
			return hooks{}, errors.New("sandbox manager: nil extension")
		}
		n := e.Name()
		if seen[n] {
			return hooks{}, fmt.Errorf("sandbox manager: extension %s registered twice", n)
		}
		seen[n] = true
		if h, ok := e.(PrepareHook); ok {
			hs.prepare = append(hs.prepare, namedHook[PrepareHook]{n, h})
		}
		if h, ok := e.(CreateHook); ok {
			hs.create = append(hs.create, namedHook[CreateHook]{n, h})
		}
		if h, ok := e.(StartHook); ok {
			hs.start = append(hs.start, namedHook[StartHook]{n, h})
		}
		if h, ok := e.(StopHook); ok {
			hs.stop = append(hs.stop, namedHook[StopHook]{n, h})
		}
		if h, ok := e.(RecoverHook); ok {
			hs.recover = append(hs.recover, namedHook[RecoverHook]{n, h})
		}
		if h, ok := e.(DeleteHook); ok {
			hs.delete = append(hs.delete, namedHook[DeleteHook]{n, h})
		}
		if h, ok := e.(PurgeHook); ok {
			hs.purge = append(hs.purge, namedHook[PurgeHook]{n, h})
		}
		if h, ok := e.(ExecWrapper); ok {
			hs.exec = append(hs.exec, namedHook[ExecWrapper]{n, h})
		}
		if h, ok := e.(StreamWrapper); ok {
			hs.stream = append(hs.stream, namedHook[StreamWrapper]{n, h})
		}
		if h, ok := e.(CreateInterceptor); ok {
			hs.intercept = append(hs.intercept, namedHook[CreateInterceptor]{n, h})
		}
		if h, ok := e.(Observer); ok {
			hs.observers = append(hs.observers, h)
		}
	}
	return hs, nil
}

// provision calls every Provisioner of exts.
func (m *Manager) provision(exts []Extension) error {
	for _, e := range exts {
		if p, ok := e.(Provisioner); ok {
			if err := p.Provision(m); err != nil {
				return fmt.Errorf("sandbox manager: extension %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// prepare runs the prepare hooks on a create request. Without any, the
// request's network spec is refused unless it asks for nothing (mode
// "none" without rules, recorded as no spec), as a daemon without an
// egress proxy refuses it: it is never recorded unvalidated.
func (m *Manager) prepare(ctx context.Context, req *api.CreateSandboxRequest) error {
	if len(m.hooks.prepare) == 0 && req.Network != nil {
		n := req.Network
		if (n.Mode != "" && n.Mode != api.NetworkNone) || len(n.Allow)+len(n.Deny)+len(n.Credentials) > 0 {
			return fmt.Errorf("network mode %q: this daemon has no egress proxy: %w", n.Mode, errdefs.ErrFailedPrecondition)
		}
		req.Network = nil
	}
	for _, x := range m.hooks.prepare {
		if err := x.h.PrepareCreate(ctx, req); err != nil {
			return err
		}
	}
	return nil
}

// closeExtensions closes the extensions that are io.Closers, last first.
func (m *Manager) closeExtensions() {
	for i := len(m.cfg.Extensions) - 1; i >= 0; i-- {
		if c, ok := m.cfg.Extensions[i].(io.Closer); ok {
			if err := c.Close(); err != nil {
				m.log.Warn("closing extension", "extension", m.cfg.Extensions[i].Name(), "err", err)
			}
		}
	}
}

// onCreate runs the start hooks (cause create) and then the create hooks
// of a new sandbox; the first error stops them.
func (m *Manager) onCreate(ctx context.Context, b *box) error {
	h := m.handle(b)
	for _, x := range m.hooks.start {
		if err := x.h.OnStart(ctx, h, api.CauseCreate); err != nil {
			return err
		}
	}
	for _, x := range m.hooks.create {
		if err := x.h.OnCreate(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// onStart runs the start hooks of a sandbox whose new guest answers;
// errors are logged.
func (m *Manager) onStart(ctx context.Context, b *box, cause string) {
	h := m.handle(b)
	for _, x := range m.hooks.start {
		if err := x.h.OnStart(ctx, h, cause); err != nil {
			m.log.WarnContext(ctx, "start hook failed", "extension", x.name, "sandbox", h.ID(), "cause", cause, "err", err)
		}
	}
}

// onStop runs the stop hooks of a sandbox whose guest stopped.
func (m *Manager) onStop(ctx context.Context, b *box, to string) {
	h := m.handle(b)
	for _, x := range m.hooks.stop {
		x.h.OnStop(ctx, h, to)
	}
}

// onRecover runs the recover hooks of a re-adopted sandbox; errors are
// logged.
func (m *Manager) onRecover(ctx context.Context, b *box) {
	h := m.handle(b)
	for _, x := range m.hooks.recover {
		if err := x.h.OnRecover(ctx, h); err != nil {
			m.log.WarnContext(ctx, "recover hook failed", "extension", x.name, "sandbox", h.ID(), "err", err)
		}
	}
}

// onDelete runs the delete hooks of a deleted sandbox.
func (m *Manager) onDelete(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx)
	for _, x := range m.hooks.delete {
		x.h.OnDelete(ctx, id)
	}
}

// wrapExecChecked is wrapExec, then refuses a request whose secrets or
// run token no wrapper took (a Manager without the runsecrets extension):
// they are never passed to the guest unresolved.
func (m *Manager) wrapExecChecked(ctx context.Context, b *box, req *api.ExecRequest) (execChain, error) {
	chain, err := m.wrapExec(ctx, b, req)
	if err != nil {
		return nil, err
	}
	if len(req.Secrets) > 0 || req.Token {
		chain.abort()
		return nil, fmt.Errorf("secrets and run tokens are not configured: %w", errdefs.ErrFailedPrecondition)
	}
	return chain, nil
}

// execChain is the ExecRuns of one process, in registration order.
type execChain []ExecRun

// wrapExec runs the exec wrappers on req. On error the runs joined so far
// are aborted.
func (m *Manager) wrapExec(ctx context.Context, b *box, req *api.ExecRequest) (execChain, error) {
	h := m.handle(b)
	if RunIDFrom(ctx) == "" {
		// Every process has a run id its wrappers share (the run token's,
		// the flight recorder's), the caller's when it named one.
		ctx = WithRunID(ctx, NewRunID())
	}
	var chain execChain
	for _, x := range m.hooks.exec {
		r, err := x.h.WrapExec(ctx, h, req)
		if err != nil {
			chain.abort()
			return nil, err
		}
		if r != nil {
			chain = append(chain, r)
		}
	}
	return chain, nil
}

// abort tells every run that its process did not start.
func (c execChain) abort() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i].Abort()
	}
}

// started tells every run, last first, that process pid started, threading
// s (nil for a background process) through them.
func (c execChain) started(pid int, s execstream.Stream) execstream.Stream {
	for i := len(c) - 1; i >= 0; i-- {
		if w := c[i].Started(pid, s); s != nil && w != nil {
			s = w
		}
	}
	return s
}

// wrapStream passes the stream of an attach or watch of process pid
// through the stream wrappers, last first.
func (m *Manager) wrapStream(b *box, pid int, s execstream.Stream) execstream.Stream {
	h := m.handle(b)
	for i := len(m.hooks.stream) - 1; i >= 0; i-- {
		if w := m.hooks.stream[i].h.WrapStream(h, pid, s); w != nil {
			s = w
		}
	}
	return s
}

// observe shows op to every observer.
func (m *Manager) observe(ctx context.Context, op Op) {
	if len(m.hooks.observers) == 0 {
		return
	}
	if op.At.IsZero() {
		op.At = m.cfg.Clock.Now().UTC()
	}
	for _, o := range m.hooks.observers {
		o.Observe(ctx, op)
	}
}

// observeBox shows an operation on b that ended with err.
func (m *Manager) observeBox(ctx context.Context, kind string, b *box, detail string, err error) {
	if len(m.hooks.observers) == 0 {
		return
	}
	m.observe(ctx, Op{Kind: kind, Sandbox: b.id(), Tenant: b.owner(), Detail: detail, Err: err, Hidden: b.isHidden()})
}

// observeBoxSince shows an operation on b that started at start and
// ended with err, with its duration.
func (m *Manager) observeBoxSince(ctx context.Context, kind string, b *box, detail string, start time.Time, err error) {
	if len(m.hooks.observers) == 0 {
		return
	}
	m.observe(ctx, Op{Kind: kind, Sandbox: b.id(), Tenant: b.owner(), Detail: detail, Err: err, Duration: time.Since(start), Hidden: b.isHidden()})
}

// observeTransition shows b's last transition (one recorded without
// setStateLocked: a create, a hidden sandbox's hand-out).
func (m *Manager) observeTransition(ctx context.Context, b *box) {
	if len(m.hooks.observers) == 0 {
		return
	}
	b.mu.Lock()
	var t *api.Transition
	if lt := b.rec.Sandbox.LastTransition; lt != nil {
		c := *lt
		t = &c
	}
	b.mu.Unlock()
	if t != nil {
		m.observe(ctx, Op{Kind: OpTransition, Sandbox: b.id(), Tenant: b.owner(), Transition: t, At: t.At})
	}
}
