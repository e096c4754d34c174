package sandbox

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/tenant"
)

// TunnelHandler serves one connection a program inside sandboxID made to a
// tunnelled port (see internal/guest/tunnel.go). The sandbox identity comes
// from the guest socket the daemon dialled, so it cannot be forged from
// inside. The handler owns conn and must close it; ctx ends when the
// tunnel does (sandbox deleted, daemon shutting down, session dropped).
type TunnelHandler func(ctx context.Context, sandboxID string, conn net.Conn)

// maxTunnelStreams bounds the connections served at once per sandbox; more
// are closed at once.
const maxTunnelStreams = 512

// Back-off between attempts to (re)open a sandbox's tunnel.
const (
	tunnelRetryMin = 100 * time.Millisecond
	tunnelRetryMax = 5 * time.Second
)

type tunnelRoute struct {
	handler TunnelHandler
	enabled func(api.Sandbox) bool
}

// tunnelRegistry holds the tunnel routes and the per-sandbox keepers.
type tunnelRegistry struct {
	// mu guards the fields below.
	mu      sync.Mutex
	routes  map[int]tunnelRoute
	keepers map[string]*tunnelKeeper
	edge    NetworkEdge // see network.go
}

// tunnelKeeper keeps one sandbox's tunnel open.
type tunnelKeeper struct {
	cancel  context.CancelFunc
	refresh chan struct{} // buffered 1: the port set may have changed
	done    chan struct{}
}

// HandleTunnelPort routes connections made inside every sandbox to
// 127.0.0.1:port to h. Register handlers before Recover: sandboxes pick up
// the routes when their tunnel is (re)opened.
func (m *Manager) HandleTunnelPort(port int, h TunnelHandler) {
	m.HandleTunnelPortIf(port, nil, h)
}

// HandleTunnelPortIf is HandleTunnelPort for the sandboxes enabled reports
// true for (nil: every sandbox). Sandboxes that are not enabled get no
// listener on the port at all. After a change that affects enabled, call
// refreshTunnel.
func (m *Manager) HandleTunnelPortIf(port int, enabled func(api.Sandbox) bool, h TunnelHandler) {
	m.tun.mu.Lock()
	defer m.tun.mu.Unlock()
	if m.tun.routes == nil {
		m.tun.routes = make(map[int]tunnelRoute)
	}
	m.tun.routes[port] = tunnelRoute{handler: h, enabled: enabled}
}

// tunnelPorts returns the ports to tunnel for b, sorted.
func (m *Manager) tunnelPorts(b *box) []int {
	sb := b.view()
	m.tun.mu.Lock()
	defer m.tun.mu.Unlock()
	var ports []int
	for p, r := range m.tun.routes {
		if r.enabled == nil || r.enabled(sb) {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return ports
}

func (m *Manager) tunnelRoute(port int) (tunnelRoute, bool) {
	m.tun.mu.Lock()
	defer m.tun.mu.Unlock()
	r, ok := m.tun.routes[port]
	return r, ok
}

// startTunnel starts the keeper of b's tunnel.
func (m *Manager) startTunnel(b *box) {
	id := b.rec.Sandbox.ID
	ctx, cancel := context.WithCancel(context.Background())
	k := &tunnelKeeper{cancel: cancel, refresh: make(chan struct{}, 1), done: make(chan struct{})}
	m.tun.mu.Lock()
	if m.tun.keepers == nil {
		m.tun.keepers = make(map[string]*tunnelKeeper)
	}
	old := m.tun.keepers[id]
	m.tun.keepers[id] = k
	m.tun.mu.Unlock()
	if old != nil {
		old.cancel()
	}
	go m.keepTunnel(ctx, b, k)
}

// stopTunnel stops the keeper of sandbox id (if any) and waits for it.
func (m *Manager) stopTunnel(id string) {
	m.tun.mu.Lock()
	k := m.tun.keepers[id]
	delete(m.tun.keepers, id)
	m.tun.mu.Unlock()
	if k != nil {
		k.cancel()
		<-k.done
	}
}

// stopTunnels stops every keeper.
func (m *Manager) stopTunnels() {
	m.tun.mu.Lock()
	ids := make([]string, 0, len(m.tun.keepers))
	for id := range m.tun.keepers {
		ids = append(ids, id)
	}
	m.tun.mu.Unlock()
	for _, id := range ids {
		m.stopTunnel(id)
	}
}

// refreshTunnel makes sandbox id's keeper recompute its ports and reopen
// the tunnel if they changed.
func (m *Manager) refreshTunnel(id string) {
	m.tun.mu.Lock()
	k := m.tun.keepers[id]
	m.tun.mu.Unlock()
	if k == nil {
		return
	}
	select {
	case k.refresh <- struct{}{}:
	default:
	}
}

// keepTunnel opens b's tunnel with the ports its routes enable, serves it,
// and opens it again whenever it drops or the port set changes, until ctx
// ends or the sandbox's guest exits.
func (m *Manager) keepTunnel(ctx context.Context, b *box, k *tunnelKeeper) {
	defer close(k.done)
	id := b.rec.Sandbox.ID
	b.mu.Lock()
	rt := b.rt
	b.mu.Unlock()
	if rt == nil {
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
		ports := m.tunnelPorts(b)
		if len(ports) == 0 {
			if !wait(24 * time.Hour) {
				return
			}
			continue
		}
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		tun, err := b.guest.OpenTunnel(octx, ports)
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
		reopen := m.serveTunnel(ctx, b, tun, ports, k, exited)
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
func (m *Manager) serveTunnel(ctx context.Context, b *box, tun tunnel, ports []int, k *tunnelKeeper, exited <-chan struct{}) bool {
	id := b.rec.Sandbox.ID
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
				r.handler(tenant.WithPrincipal(sctx, tenant.Principal{Tenant: b.owner(), Scope: api.ScopeFull}), id, conn)
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
			if !slices.Equal(ports, m.tunnelPorts(b)) {
				return true
			}
		}
	}
}
