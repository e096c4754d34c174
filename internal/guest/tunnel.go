package guest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/guest/proto"
)

// The reverse tunnel (proto.OpTunnel) is how programs inside a sandbox reach
// host-side services (the egress proxy, the API bridge) without any route to
// the host: the guest listens on 127.0.0.1:<port> inside the sandbox's
// network namespace and relays every accepted connection as a new yamux
// stream over the connection the daemon opened. The daemon learns which
// sandbox a stream belongs to from the guest socket it dialled, so a
// sandbox cannot claim another's identity.
//
// Listeners outlive sessions: when the daemon restarts or the session
// drops, the listeners stay bound and connections accepted while no session
// exists are closed at once (fail closed) until the daemon opens a new one.

// tunnels is the guest's tunnel state.
type tunnels struct {
	log *slog.Logger

	// mu guards the fields below.
	mu        sync.Mutex
	session   *yamux.Session
	listeners map[int]net.Listener
	closed    bool
	// opening counts sessions between their OK reply and setSession: a
	// connection accepted in that window waits for the session instead of
	// being dropped (the host considers the tunnel open once it has the
	// reply).
	opening int
}

func newTunnels(log *slog.Logger) *tunnels {
	return &tunnels{log: log, listeners: make(map[int]net.Listener)}
}

// tunnel serves one OpTunnel connection until its session ends.
func (s *server) tunnel(c *conn, req *proto.Request) error {
	if err := proto.ValidTunnelPorts(req.Ports); err != nil {
		return err
	}
	if err := s.tun.listen(req.Ports); err != nil {
		return err
	}
	s.tun.mu.Lock()
	s.tun.opening++
	s.tun.mu.Unlock()
	opened := func() {
		s.tun.mu.Lock()
		s.tun.opening--
		s.tun.mu.Unlock()
	}
	if err := c.reply(nil); err != nil {
		opened()
		return nil
	}
	sess, err := yamux.Client(&proto.BufferedConn{Conn: c.Conn, R: c.br}, proto.TunnelConfig())
	if err != nil {
		opened()
		return nil // the connection is no longer a protocol stream: just end it
	}
	s.tun.setSession(sess)
	opened()
	<-sess.CloseChan()
	s.tun.dropSession(sess)
	return nil
}

// listen binds the listeners of ports that are not bound yet and closes
// those of ports not named.
func (t *tunnels) listen(ports []int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("guest is shutting down")
	}
	want := make(map[int]bool, len(ports))
	for _, p := range ports {
		want[p] = true
		if t.listeners[p] != nil {
			continue
		}
		ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return fmt.Errorf("tunnel listener on port %d: %w", p, err)
		}
		t.listeners[p] = ln
		go t.accept(p, ln)
	}
	for p, ln := range t.listeners {
		if !want[p] {
			ln.Close()
			delete(t.listeners, p)
		}
	}
	return nil
}

// setSession makes sess the session new connections are relayed over,
// closing the one it replaces.
func (t *tunnels) setSession(sess *yamux.Session) {
	t.mu.Lock()
	old := t.session
	t.session = sess
	closed := t.closed
	t.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if closed {
		sess.Close()
	}
}

func (t *tunnels) dropSession(sess *yamux.Session) {
	t.mu.Lock()
	if t.session == sess {
		t.session = nil
	}
	t.mu.Unlock()
}

// sessionFor returns the current session; while one is being opened it
// waits for it, up to openWait.
func (t *tunnels) sessionFor() *yamux.Session {
	const openWait = 2 * time.Second
	deadline := time.Now().Add(openWait)
	for {
		t.mu.Lock()
		sess, opening := t.session, t.opening > 0
		t.mu.Unlock()
		if sess != nil || !opening || time.Now().After(deadline) {
			return sess
		}
		time.Sleep(time.Millisecond)
	}
}

// close closes every listener and the session.
func (t *tunnels) close() {
	t.mu.Lock()
	t.closed = true
	sess := t.session
	for p, ln := range t.listeners {
		ln.Close()
		delete(t.listeners, p)
	}
	t.mu.Unlock()
	if sess != nil {
		sess.Close()
	}
}

func (t *tunnels) accept(port int, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		go t.relay(port, c)
	}
}

// relayBuf is the copy buffer of each direction of a relayed connection.
const relayBuf = 256 << 10

// relay carries one inside connection over a new stream of the current
// session. Without a session the connection is closed: nothing inside can
// reach the host side except through the daemon's session.
func (t *tunnels) relay(port int, c net.Conn) {
	defer c.Close()
	sess := t.sessionFor()
	if sess == nil {
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		t.log.Debug("opening tunnel stream", "port", port, "err", err)
		return
	}
	defer st.Close()
	if err := proto.WriteStreamPort(st, port); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Large reads make large yamux frames: fewer frames and syscalls
		// per byte (the relay runs on the sandbox's CPU quota). The
		// struct hides TCPConn's WriterTo, which would copy in 32 KiB.
		_, _ = io.CopyBuffer(st, struct{ io.Reader }{c}, make([]byte, relayBuf))
		_ = st.Close() // half-close: yamux sends FIN, reads continue
	}()
	_, _ = io.CopyBuffer(c, struct{ io.Reader }{st}, make([]byte, relayBuf))
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	<-done
}
