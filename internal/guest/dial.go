package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// dialTimeout bounds connecting to a port inside the sandbox: loopback
// answers at once or refuses; only a listener whose backlog is full keeps
// a connect waiting.
const dialTimeout = 5 * time.Second

// dial serves one OpDial connection: it connects to 127.0.0.1:<port>
// inside the sandbox's network namespace and splices the two connections
// until both directions are done. A half-close on either side is passed
// on, so a request/response protocol that shuts its write side down still
// gets its answer.
func (s *server) dial(c *conn, req *proto.Request) error {
	if req.Port < 1 || req.Port > 65535 {
		return fmt.Errorf("dial port %d is out of range: %w", req.Port, errdefs.ErrInvalidArgument)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port))
	up, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return fmt.Errorf("connecting to port %d in the sandbox: %v: %w", req.Port, err, errdefs.ErrUnavailable)
	}
	defer up.Close()
	if tc, ok := up.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if err := c.reply(nil); err != nil {
		return nil // the client is gone: nothing to report to
	}
	down := &proto.BufferedConn{Conn: c.Conn, R: c.br}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, down)
		closeWrite(up)
	}()
	_, _ = io.Copy(c.Conn, up)
	closeWrite(c.Conn)
	<-done
	return nil
}

// closeWrite shuts down the write side of conn where it can (TCP and unix
// sockets), or closes it.
func closeWrite(conn net.Conn) {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err == nil || errors.Is(err, net.ErrClosed) {
			return
		}
	}
	_ = conn.Close()
}
