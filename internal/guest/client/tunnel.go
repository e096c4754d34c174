package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// streamHeaderTimeout bounds how long a new tunnel stream may take to name
// its port.
const streamHeaderTimeout = 10 * time.Second

// Tunnel is the host end of a reverse tunnel (proto.OpTunnel): each
// connection a program inside the sandbox makes to 127.0.0.1:<port>, for a
// port given to OpenTunnel, arrives here as a net.Conn from Accept.
//
// The guest is untrusted: streams naming a port that was not requested, or
// naming none in time, are dropped. A Tunnel is safe for concurrent use; it
// ends when Close is called, the guest closes it, or keepalives fail.
type Tunnel struct {
	sess  *yamux.Session
	ports map[int]bool
	ready chan tunnelConn
	once  sync.Once
}

type tunnelConn struct {
	port int
	conn net.Conn
}

// OpenTunnel asks the guest to listen on 127.0.0.1:<port> inside the
// sandbox for each of ports and relay accepted connections to the returned
// Tunnel. ctx bounds the set-up only; the tunnel lives until closed. A new
// tunnel replaces the guest's previous one.
func (c *Client) OpenTunnel(ctx context.Context, ports []int) (*Tunnel, error) {
	if err := proto.ValidTunnelPorts(ports); err != nil {
		return nil, fmt.Errorf("guest %s: %w", proto.OpTunnel, err)
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpTunnel, Ports: ports})
	if err != nil {
		return nil, err
	}
	if err := w.result(nil); err != nil {
		w.close()
		return nil, err
	}
	w.stop() // from here on the connection outlives ctx
	_ = w.conn.SetDeadline(time.Time{})
	sess, err := yamux.Server(&proto.BufferedConn{Conn: w.conn, R: w.br}, proto.TunnelConfig())
	if err != nil {
		w.conn.Close()
		return nil, fmt.Errorf("guest %s: %v: %w", proto.OpTunnel, err, errdefs.ErrUnavailable)
	}
	t := &Tunnel{sess: sess, ports: make(map[int]bool, len(ports)), ready: make(chan tunnelConn)}
	for _, p := range ports {
		t.ports[p] = true
	}
	go t.acceptLoop()
	return t, nil
}

func (t *Tunnel) acceptLoop() {
	for {
		st, err := t.sess.AcceptStream()
		if err != nil {
			return
		}
		go t.handshake(st)
	}
}

// handshake reads a stream's port header and hands the stream to Accept.
func (t *Tunnel) handshake(st *yamux.Stream) {
	_ = st.SetReadDeadline(time.Now().Add(streamHeaderTimeout))
	port, err := proto.ReadStreamPort(st)
	if err != nil || !t.ports[port] {
		st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	select {
	case t.ready <- tunnelConn{port, streamConn{st}}:
	case <-t.sess.CloseChan():
		st.Close()
	}
}

// Accept waits for the next connection made inside the sandbox and returns
// the inside port it was made to. It returns an error wrapping
// errdefs.ErrUnavailable once the tunnel has ended.
func (t *Tunnel) Accept() (port int, conn net.Conn, err error) {
	select {
	case tc := <-t.ready:
		return tc.port, tc.conn, nil
	case <-t.sess.CloseChan():
		return 0, nil, fmt.Errorf("guest tunnel closed: %w", errdefs.ErrUnavailable)
	}
}

// Done is closed when the tunnel has ended.
func (t *Tunnel) Done() <-chan struct{} { return t.sess.CloseChan() }

// Close ends the tunnel and every connection carried over it.
func (t *Tunnel) Close() error {
	t.once.Do(func() { _ = t.sess.Close() })
	return nil
}

// streamConn is a tunnel stream whose deadline errors are
// os.ErrDeadlineExceeded, as with a TCP connection. yamux reports them as a
// net.Error that is not Temporary, and crypto/tls then treats the
// connection as broken for good: an http.Server serving TLS over a stream
// (the egress proxy's interception) aborts its background read with a past
// deadline after every response and so closed every keep-alive connection
// after its first request.
type streamConn struct{ *yamux.Stream }

func (c streamConn) Read(p []byte) (int, error) {
	n, err := c.Stream.Read(p)
	return n, deadlineErr(err)
}

func (c streamConn) Write(p []byte) (int, error) {
	n, err := c.Stream.Write(p)
	return n, deadlineErr(err)
}

func deadlineErr(err error) error {
	if errors.Is(err, yamux.ErrTimeout) {
		return os.ErrDeadlineExceeded
	}
	return err
}
