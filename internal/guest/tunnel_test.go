package guest_test

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func dialInside(t *testing.T, port int) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp4", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func TestTunnelRelaysByPortAndReopens(t *testing.T) {
	g, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	p1, p2 := freePort(t), freePort(t)
	tun, err := g.OpenTunnel(ctx, []int{p1, p2})
	if err != nil {
		t.Fatal(err)
	}
	// Echo server on the host side, upper-casing nothing: it prefixes the port.
	serve := func(tun interface {
		Accept() (int, net.Conn, error)
	}) {
		for {
			port, c, err := tun.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = io.WriteString(c, strconv.Itoa(port)+":"+line)
			}()
		}
	}
	go serve(tun)

	for _, p := range []int{p1, p2} {
		c := dialInside(t, p)
		if _, err := io.WriteString(c, "hello\n"); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(p) + ":hello\n"; string(got) != want {
			t.Fatalf("port %d: got %q, want %q", p, got, want)
		}
	}

	// The session drops: the listener stays but connections are refused
	// (closed at once) until a new session exists.
	tun.Close()
	<-tun.Done()
	if _, _, err := tun.Accept(); !errdefs.IsUnavailable(err) {
		t.Fatalf("Accept after Close: %v", err)
	}
	c := dialInside(t, p1)
	if b, _ := io.ReadAll(c); len(b) != 0 {
		t.Fatalf("read %q without a session", b)
	}

	// A new tunnel naming only p1 takes over and closes p2's listener.
	tun2, err := g.OpenTunnel(ctx, []int{p1})
	if err != nil {
		t.Fatal(err)
	}
	defer tun2.Close()
	go serve(tun2)
	c = dialInside(t, p1)
	_, _ = io.WriteString(c, "again\n")
	if got, _ := io.ReadAll(c); string(got) != strconv.Itoa(p1)+":again\n" {
		t.Fatalf("after reopen: %q", got)
	}
	if c, err := net.DialTimeout("tcp4", "127.0.0.1:"+strconv.Itoa(p2), time.Second); err == nil {
		c.Close()
		t.Fatal("port dropped from the tunnel still listens")
	}
}

func TestTunnelRejectsBadPorts(t *testing.T) {
	g, _ := startGuest(t, guest.Options{})
	for _, ports := range [][]int{nil, {0}, {70000}, {5000, 5000}} {
		if _, err := g.OpenTunnel(tctx(t), ports); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ports %v: %v", ports, err)
		}
	}
}
