package connlimit

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// serve accepts on l until it is closed, handing each connection to keep.
func serve(t *testing.T, l *Listener, keep chan<- net.Conn) {
	t.Helper()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			keep <- c
		}
	}()
}

func newTestListener(t *testing.T, lim Limits) (*Listener, chan net.Conn) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, lim, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1024)
	serve(t, l, accepted)
	return l, accepted
}

// dial connects from src (a loopback address) to l.
func dial(t *testing.T, l net.Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer reports whether the server closed c within d.
func closedByPeer(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func waitStats(t *testing.T, l *Listener, want Stats) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for l.Stats() != want {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want %+v", l.Stats(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPerAddressCap(t *testing.T) {
	l, accepted := newTestListener(t, Limits{MaxPerAddr: 2})
	a1, a2 := dial(t, l, "127.0.0.2"), dial(t, l, "127.0.0.2")
	a3 := dial(t, l, "127.0.0.2")
	b := dial(t, l, "127.0.0.3")
	if !closedByPeer(a3, time.Second) {
		t.Fatal("third connection from one address was not closed")
	}
	for _, c := range []net.Conn{a1, a2, b} {
		if closedByPeer(c, 50*time.Millisecond) {
			t.Fatal("a connection within the caps was closed")
		}
	}
	waitStats(t, l, Stats{Total: 3, Unauthenticated: 3, Addrs: 2})
	// Closing one (server side) makes room for the address again.
	(<-accepted).Close()
	waitStats(t, l, Stats{Total: 2, Unauthenticated: 2, Addrs: 2})
	a4 := dial(t, l, "127.0.0.2")
	if closedByPeer(a4, 100*time.Millisecond) {
		t.Fatal("connection refused after a place was freed")
	}
}

func TestUnauthenticatedCapEvictsOldest(t *testing.T) {
	l, accepted := newTestListener(t, Limits{MaxUnauthenticated: 2})
	first := dial(t, l, "127.0.0.2")
	waitStats(t, l, Stats{Total: 1, Unauthenticated: 1, Addrs: 1})
	second := dial(t, l, "127.0.0.3")
	waitStats(t, l, Stats{Total: 2, Unauthenticated: 2, Addrs: 2})
	// Authenticate the second: it is never evicted.
	<-accepted
	srv2 := <-accepted
	MarkAuthenticated(WithConn(context.Background(), srv2))
	waitStats(t, l, Stats{Total: 2, Unauthenticated: 1, Addrs: 2})
	third := dial(t, l, "127.0.0.4")
	fourth := dial(t, l, "127.0.0.5")
	if !closedByPeer(first, time.Second) {
		t.Fatal("oldest unauthenticated connection not evicted")
	}
	for _, c := range []net.Conn{second, third, fourth} {
		if closedByPeer(c, 50*time.Millisecond) {
			t.Fatal("authenticated or newer connection closed")
		}
	}
	waitStats(t, l, Stats{Total: 3, Unauthenticated: 2, Addrs: 3})
}

func TestTotalCapRefusesWhenAllAuthenticated(t *testing.T) {
	l, accepted := newTestListener(t, Limits{Max: 1})
	a := dial(t, l, "127.0.0.2")
	MarkAuthenticated(WithConn(context.Background(), <-accepted))
	waitStats(t, l, Stats{Total: 1, Unauthenticated: 0, Addrs: 1})
	b := dial(t, l, "127.0.0.3")
	if !closedByPeer(b, time.Second) {
		t.Fatal("connection over the total cap not closed")
	}
	if closedByPeer(a, 50*time.Millisecond) {
		t.Fatal("authenticated connection closed")
	}
}

// An unauthenticated connection's read deadlines are clamped; once
// authenticated, the deadline it asked for applies.
func TestUnauthenticatedIdleClamp(t *testing.T) {
	l, accepted := newTestListener(t, Limits{UnauthenticatedIdle: 100 * time.Millisecond})
	dial(t, l, "127.0.0.2")
	srv := <-accepted
	_ = srv.SetReadDeadline(time.Time{}) // asks for none
	start := time.Now()
	_, err := srv.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) > time.Second {
		t.Fatalf("unauthenticated read: %v after %v, want a timeout after ~100ms", err, time.Since(start))
	}

	c := dial(t, l, "127.0.0.3")
	srv = <-accepted
	_ = srv.SetReadDeadline(time.Time{})
	MarkAuthenticated(WithConn(context.Background(), srv))
	done := make(chan error, 1)
	go func() { _, err := srv.Read(make([]byte, 1)); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("authenticated read ended early: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_, _ = c.Write([]byte("x"))
	if err := <-done; err != nil {
		t.Fatalf("authenticated read: %v", err)
	}
}

// WithConn finds the Conn under a TLS connection.
func TestWithConnUnwrapsTLS(t *testing.T) {
	l, accepted := newTestListener(t, Limits{})
	dial(t, l, "127.0.0.2")
	srv := <-accepted
	ctx := WithConn(context.Background(), tls.Server(srv, &tls.Config{}))
	if c, ok := ctx.Value(connKey{}).(*Conn); !ok || c != srv {
		t.Fatal("Conn under tls.Conn not found")
	}
	MarkAuthenticated(ctx)
	if s := l.Stats(); s.Unauthenticated != 0 {
		t.Fatalf("stats %+v after authenticating through TLS", s)
	}
	// A context without a Conn is left alone.
	MarkAuthenticated(WithConn(context.Background(), nil))
}

func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.2:5":             "127.0.0.2",
		"[::ffff:10.0.0.1]:5":     "10.0.0.1",
		"[2001:db8:1:2:3::4]:443": "2001:db8:1:2::",
		"[2001:db8:1:2:ff::]:1":   "2001:db8:1:2::",
	} {
		a, _ := net.ResolveTCPAddr("tcp", in)
		if got := clientKey(a); got != netip.MustParseAddr(want) {
			t.Errorf("%s: %v, want %s", in, got, want)
		}
	}
}

func TestDefaultLimits(t *testing.T) {
	for _, tc := range []struct {
		nofile           uint64
		max, per, unauth int
	}{
		{1024, 768, 192, 384},
		{20000, 15000, 256, 7500},
		{300, 150, 37, 75},
	} {
		l := DefaultLimits(tc.nofile)
		if l.Max != tc.max || l.MaxPerAddr != tc.per || l.MaxUnauthenticated != tc.unauth || l.UnauthenticatedIdle != DefaultUnauthenticatedIdle {
			t.Errorf("DefaultLimits(%d) = %+v", tc.nofile, l)
		}
	}
}
