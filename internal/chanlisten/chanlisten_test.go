package chanlisten

import (
	"errors"
	"net"
	"testing"
)

func TestDeliverAcceptClose(t *testing.T) {
	addr := &net.UnixAddr{Name: "test", Net: "unix"}
	l := New(addr)
	if l.Addr() != addr {
		t.Fatalf("Addr = %v, want %v", l.Addr(), addr)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	got := make(chan net.Conn)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	if !l.Deliver(a) {
		t.Fatal("Deliver on an open listener returned false")
	}
	if c := <-got; c != a {
		t.Fatalf("Accept returned %v, want the delivered conn", c)
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed before Close")
	default:
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if l.Deliver(b) {
		t.Fatal("Deliver on a closed listener returned true")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
