package client

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// DialPort connects to 127.0.0.1:port inside the sandbox through the
// guest (proto.OpDial) and returns the connection: what is written to it
// reaches the service inside, what the service sends is read from it.
// CloseWrite half-closes it. ctx bounds the set-up only; the connection
// lives until closed. A port nothing listens on is an error wrapping
// errdefs.ErrUnavailable; a guest that predates OpDial answers
// errdefs.ErrNotImplemented.
//
// The bytes come from the sandbox: the caller treats them as untrusted
// input, as it would a connection from the network.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("guest %s: port %d is out of range: %w", proto.OpDial, port, errdefs.ErrInvalidArgument)
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpDial, Port: port})
	if err != nil {
		return nil, err
	}
	if err := w.result(nil); err != nil {
		w.close()
		return nil, err
	}
	w.stop() // from here on the connection outlives ctx
	_ = w.conn.SetDeadline(time.Time{})
	return &dialConn{BufferedConn: proto.BufferedConn{Conn: w.conn, R: w.br}}, nil
}

// dialConn is a DialPort connection: a unix socket whose reads drain the
// bytes buffered while the reply was read.
type dialConn struct{ proto.BufferedConn }

// CloseWrite half-closes the connection: the service inside reads EOF.
func (d *dialConn) CloseWrite() error {
	if cw, ok := d.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return d.Conn.Close()
}
