package guest_test

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
)

// A tunnel connection reports deadlines as a TCP connection does
// (os.ErrDeadlineExceeded, temporary), and stays usable after one: what
// crypto/tls and net/http rely on to keep a connection alive after aborting
// a read with a past deadline.
func TestTunnelConnDeadlineIsTemporary(t *testing.T) {
	g, _ := startGuest(t, guest.Options{})
	p := freePort(t)
	tun, err := g.OpenTunnel(tctx(t), []int{p})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	// Bound the whole test: closing the tunnel unblocks Accept and reads.
	watchdog := time.AfterFunc(20*time.Second, func() { tun.Close() })
	defer watchdog.Stop()
	inside := dialInside(t, p)
	_, conn, err := tun.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	_ = conn.SetReadDeadline(time.Now().Add(-time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	//lint:ignore SA1019 crypto/tls decides on Temporary.
	if !ne.Temporary() { //nolint:staticcheck
		t.Fatalf("deadline error is not temporary: %v", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(inside, "x"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'x' {
		t.Fatalf("read after the deadline was cleared: %q %v", b, err)
	}
}
