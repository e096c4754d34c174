// Package tunnel keeps a reverse tunnel open into every running sandbox
// and routes the connections programs inside make to tunnelled ports
// (127.0.0.1:PORT inside the sandbox) to handlers on the host: the API
// bridge, the egress proxy. See internal/guest/tunnel.go for the guest's
// side.
//
// It is a feature attached to the sandbox core: a start hook opens a
// sandbox's tunnel whenever its guest starts, stop and delete hooks close
// it.
package tunnel

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Handler serves one connection a program inside sandboxID made to a
// tunnelled port (see internal/guest/tunnel.go). The sandbox identity comes
// from the guest socket the daemon dialled, so it cannot be forged from
// inside. The handler owns conn and must close it; ctx ends when the
// tunnel does (sandbox deleted, daemon shutting down, session dropped).
type Handler func(ctx context.Context, sandboxID string, conn net.Conn)

// maxTunnelStreams bounds the connections served at once per sandbox; more
// are closed at once.
const maxTunnelStreams = 512

// Back-off between attempts to (re)open a sandbox's tunnel.
const (
	tunnelRetryMin = 100 * time.Millisecond
	tunnelRetryMax = 5 * time.Second
)

type tunnelRoute struct {
	handler Handler
	enabled func(api.Sandbox) bool
}

// Tunnels is the extension: register it in sandbox.Config.Extensions.
// Routes are registered before the Manager recovers sandboxes (a
// sandbox picks up the routes when its tunnel is (re)opened). Its methods
// are safe for concurrent use.
type Tunnels struct {
	log *slog.Logger

	// mu guards the fields below.
	mu      sync.Mutex
	routes  map[int]tunnelRoute
	keepers map[string]*tunnelKeeper
	closed  bool
}

var (
	_ sandbox.Extension   = (*Tunnels)(nil)
	_ sandbox.StartHook   = (*Tunnels)(nil)
	_ sandbox.RecoverHook = (*Tunnels)(nil)
	_ sandbox.StopHook    = (*Tunnels)(nil)
	_ sandbox.DeleteHook  = (*Tunnels)(nil)
)

// New returns Tunnels with no routes; log is required.
func New(log *slog.Logger) *Tunnels { return &Tunnels{log: log} }

// Name implements sandbox.Extension.
func (m *Tunnels) Name() string { return "tunnel" }

// OnStart implements sandbox.StartHook: the sandbox's new guest gets a
// keeper (the old keeper ended with the old guest).
func (m *Tunnels) OnStart(ctx context.Context, h *sandbox.Handle, cause string) error {
	m.startTunnel(h)
	return nil
}

// OnRecover implements sandbox.RecoverHook: a re-adopted sandbox with a
// guest (running or paused) gets a keeper.
func (m *Tunnels) OnRecover(ctx context.Context, h *sandbox.Handle) error {
	if h.Runtime() != nil {
		m.startTunnel(h)
	}
	return nil
}

// OnStop implements sandbox.StopHook: a hibernated or stopped sandbox's
// keeper ends; a paused one's stays (its tunnel serves again on thaw).
func (m *Tunnels) OnStop(ctx context.Context, h *sandbox.Handle, to string) {
	if to != api.StatePaused {
		m.stopTunnel(h.ID())
	}
}

// OnDelete implements sandbox.DeleteHook.
func (m *Tunnels) OnDelete(ctx context.Context, id string) { m.stopTunnel(id) }

// Close stops every keeper and waits for them; keepers of guests that
// start later are not started. Closing twice is a no-op.
func (m *Tunnels) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.stopTunnels()
	return nil
}

// tunnelKeeper keeps one sandbox's tunnel open.
type tunnelKeeper struct {
	cancel  context.CancelFunc
	refresh chan struct{} // buffered 1: the port set may have changed
	done    chan struct{}
}

// HandlePort routes connections made inside every sandbox to
// 127.0.0.1:port to h. Register handlers before Recover: sandboxes pick up
// the routes when their tunnel is (re)opened.
func (m *Tunnels) HandlePort(port int, h Handler) {
	m.HandlePortIf(port, nil, h)
}

// HandlePortIf is HandlePort for the sandboxes enabled reports true for
// (nil: every sandbox). Sandboxes that are not enabled get no listener on
// the port at all. After a change that affects enabled, call Refresh.
func (m *Tunnels) HandlePortIf(port int, enabled func(api.Sandbox) bool, h Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.routes == nil {
		m.routes = make(map[int]tunnelRoute)
	}
	m.routes[port] = tunnelRoute{handler: h, enabled: enabled}
}

// Routed reports whether port has a route: inside a sandbox it belongs
// to the platform (the API bridge, the egress proxy), not to the
// sandbox's own programs.
func (m *Tunnels) Routed(port int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.routes[port]
	return ok
}

// tunnelPorts returns the ports to tunnel for h, sorted.
func (m *Tunnels) tunnelPorts(h *sandbox.Handle) []int {
	sb := h.Sandbox()
	m.mu.Lock()
	defer m.mu.Unlock()
	var ports []int
	for p, r := range m.routes {
		if r.enabled == nil || r.enabled(sb) {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return ports
}

func (m *Tunnels) tunnelRoute(port int) (tunnelRoute, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.routes[port]
	return r, ok
}

// startTunnel starts the keeper of h's tunnel.
func (m *Tunnels) startTunnel(h *sandbox.Handle) {
	id := h.ID()
	ctx, cancel := context.WithCancel(context.Background())
	k := &tunnelKeeper{cancel: cancel, refresh: make(chan struct{}, 1), done: make(chan struct{})}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		cancel()
		return
	}
	if m.keepers == nil {
		m.keepers = make(map[string]*tunnelKeeper)
	}
	old := m.keepers[id]
	m.keepers[id] = k
	m.mu.Unlock()
	if old != nil {
		old.cancel()
	}
	go m.keepTunnel(ctx, h, k)
}

// stopTunnel stops the keeper of sandbox id (if any) and waits for it.
func (m *Tunnels) stopTunnel(id string) {
	m.mu.Lock()
	k := m.keepers[id]
	delete(m.keepers, id)
	m.mu.Unlock()
	if k != nil {
		k.cancel()
		<-k.done
	}
}

// stopTunnels stops every keeper.
func (m *Tunnels) stopTunnels() {
	m.mu.Lock()
	ids := make([]string, 0, len(m.keepers))
	for id := range m.keepers {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.stopTunnel(id)
	}
}

// Refresh makes sandbox id's keeper recompute its ports and reopen the
// tunnel if they changed.
func (m *Tunnels) Refresh(id string) {
	m.mu.Lock()
	k := m.keepers[id]
	m.mu.Unlock()
	if k == nil {
		return
	}
	select {
	case k.refresh <- struct{}{}:
	default:
	}
}

// keepTunnel opens h's tunnel with the ports its routes enable, serves it,
// and opens it again whenever it drops or the port set changes, until ctx
// ends or the sandbox's guest exits.
func (m *Tunnels) keepTunnel(ctx context.Context, h *sandbox.Handle, k *tunnelKeeper) {
	defer close(k.done)
	id := h.ID()
	rt, guest := h.Runtime(), h.Guest()
	if rt == nil || guest == nil {
		return // hibernated meanwhile: waking starts a new keeper
	}
	exited := rt.Wait()
	retry := tunnelRetryMin
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-exited:
			return false
		case <-k.refresh:
			return true
		case <-t.C:
			return true
		}
	}
	for {
		ports := m.tunnelPorts(h)
		if len(ports) == 0 {
			if !wait(24 * time.Hour) {
				return
			}
			continue
		}
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		tun, err := guest.OpenTunnel(octx, ports)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Debug("opening sandbox tunnel", "sandbox", id, "err", err)
			if !wait(retry) {
				return
			}
			retry = min(retry*2, tunnelRetryMax)
			continue
		}
		retry = tunnelRetryMin
		m.log.Debug("sandbox tunnel open", "sandbox", id, "ports", ports)
		reopen := m.serveTunnel(ctx, h, tun, ports, k, exited)
		if !reopen {
			return
		}
	}
}

// tunnel is what keepTunnel needs of a guest tunnel.
type tunnel interface {
	Accept() (int, net.Conn, error)
	Done() <-chan struct{}
	Close() error
}

// serveTunnel dispatches tun's connections until it ends; it reports
// whether the keeper should open a new one.
func (m *Tunnels) serveTunnel(ctx context.Context, h *sandbox.Handle, tun tunnel, ports []int, k *tunnelKeeper, exited <-chan struct{}) bool {
	id := h.ID()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer tun.Close()
	go func() {
		sem := make(chan struct{}, maxTunnelStreams)
		for {
			port, conn, err := tun.Accept()
			if err != nil {
				return
			}
			r, ok := m.tunnelRoute(port)
			if !ok {
				conn.Close()
				continue
			}
			select {
			case sem <- struct{}{}:
			default:
				m.log.Warn("too many tunnel connections; dropping one", "sandbox", id, "port", port)
				conn.Close()
				continue
			}
			go func() {
				defer func() { <-sem }()
				// Calls made for a connection from inside the sandbox act
				// as its tenant (secrets, bridge calls).
				r.handler(tenant.WithPrincipal(sctx, tenant.Principal{Tenant: h.Owner(), Scope: api.ScopeFull}), id, conn)
			}()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-exited:
			return false
		case <-tun.Done():
			// Dropped: reopen after a short pause.
			t := time.NewTimer(tunnelRetryMin)
			select {
			case <-t.C:
				return true
			case <-ctx.Done():
				t.Stop()
				return false
			}
		case <-k.refresh:
			if !slices.Equal(ports, m.tunnelPorts(h)) {
				return true
			}
		}
	}
}
