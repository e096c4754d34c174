package guest_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
)

// TestDialSplicesBothWaysWithHalfClose: a DialPort connection reaches a
// listener on 127.0.0.1 where the guest runs, carries bytes both ways,
// and passes the client's half-close on (the service reads EOF and still
// answers).
func TestDialSplicesBothWaysWithHalfClose(t *testing.T) {
	g, _ := startGuest(t, guest.Options{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c) // until the client's half-close
				_, _ = io.WriteString(c, strings.ToUpper(string(b)))
			}()
		}
	}()
	conn, err := g.DialPort(tctx(t), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "hello through the guest"); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "HELLO THROUGH THE GUEST" {
		t.Fatalf("got %q", got)
	}
}

// TestDialRefusedAndOutOfRange: nothing listening is ErrUnavailable, a
// port outside 1..65535 is refused before anything is sent.
func TestDialRefusedAndOutOfRange(t *testing.T) {
	g, _ := startGuest(t, guest.Options{})
	if _, err := g.DialPort(tctx(t), freePort(t)); !errdefs.IsUnavailable(err) {
		t.Fatalf("dial of a closed port: %v, want unavailable", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := g.DialPort(tctx(t), p); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("dial of port %d: %v, want invalid argument", p, err)
		}
	}
}
