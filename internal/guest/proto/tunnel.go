package proto

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TunnelConfig is the yamux configuration both ends of an OpTunnel session
// use. Keepalives detect a dead peer (a daemon that restarted, a guest that
// froze); the stream window is sized for bulk transfers.
func TunnelConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = 15 * time.Second
	cfg.ConnectionWriteTimeout = 15 * time.Second
	cfg.StreamOpenTimeout = 15 * time.Second
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.AcceptBacklog = 256
	return cfg
}

// ValidTunnelPorts checks the ports of an OpTunnel request: 1..65535, no
// duplicates, at most MaxTunnelPorts.
func ValidTunnelPorts(ports []int) error {
	if len(ports) == 0 || len(ports) > MaxTunnelPorts {
		return fmt.Errorf("tunnel needs 1 to %d ports, got %d: %w", MaxTunnelPorts, len(ports), errdefs.ErrInvalidArgument)
	}
	seen := make(map[int]bool, len(ports))
	for _, p := range ports {
		if p < 1 || p > 65535 || seen[p] {
			return fmt.Errorf("tunnel port %d is out of range or repeated: %w", p, errdefs.ErrInvalidArgument)
		}
		seen[p] = true
	}
	return nil
}

// WriteStreamPort writes the 2-byte header of a tunnel stream.
func WriteStreamPort(w io.Writer, port int) error {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(port))
	_, err := w.Write(b[:])
	return err
}

// ReadStreamPort reads the 2-byte header of a tunnel stream.
func ReadStreamPort(r io.Reader) (int, error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return int(binary.BigEndian.Uint16(b[:])), nil
}

// BufferedConn is a net.Conn whose reads drain a bufio.Reader first: the
// bytes a header reader buffered past the header belong to what follows.
type BufferedConn struct {
	net.Conn
	R *bufio.Reader
}

func (c *BufferedConn) Read(p []byte) (int, error) { return c.R.Read(p) }
