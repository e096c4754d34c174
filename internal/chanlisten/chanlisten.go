// Package chanlisten is a net.Listener whose connections are handed to it
// in-process (Deliver) rather than accepted from a socket: an http.Server or
// a guest can serve connections that another part of the process made, such
// as a tunnel's streams or one end of a socketpair.
package chanlisten

import (
	"net"
	"sync"
)

// Listener is a net.Listener fed by Deliver. Its methods are safe for
// concurrent use.
type Listener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

var _ net.Listener = (*Listener)(nil)

// New returns an open Listener that reports addr as its address.
func New(addr net.Addr) *Listener {
	return &Listener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Deliver hands c to a waiting Accept, blocking until one takes it. It
// returns false, without taking c, once the listener is closed: the caller
// still owns c then.
func (l *Listener) Deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

// Accept returns the next delivered connection, or net.ErrClosed once the
// listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close ends Accept and Deliver; it does not close delivered connections.
// Repeated calls do nothing.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Done is closed once the listener is closed.
func (l *Listener) Done() <-chan struct{} { return l.closed }

// Addr returns the address given to New.
func (l *Listener) Addr() net.Addr { return l.addr }
