// Package connlimit bounds the connections a network listener holds, so
// that clients who never authenticate cannot exhaust the daemon's file
// descriptors (and with them the admin unix socket, the sandboxes and the
// store).
//
// A Listener wraps a net.Listener. Every accepted connection counts against
// three caps:
//
//   - Max, all connections of the listener together;
//   - MaxPerAddr, connections from one client address (an IPv6 client
//     counts by its /64);
//   - MaxUnauthenticated, connections on which no request has
//     authenticated yet.
//
// A connection over Max or MaxPerAddr is closed as soon as it is accepted.
// A new connection that would exceed MaxUnauthenticated (or Max) evicts the
// oldest unauthenticated one instead, so that a flood of idle connections
// cannot lock out a client that authenticates at once.
//
// A connection is unauthenticated until MarkAuthenticated is called with a
// context carrying it (see WithConn). Until then every read deadline set on
// it is clamped to UnauthenticatedIdle from the time it is set, and the
// first one is set on accept: an unauthenticated client that neither
// completes a request nor closes is cut off after that time, whatever
// longer timeouts the HTTP server asks for.
package connlimit

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Limits are the caps of a Listener; a zero field means no cap (or, for
// UnauthenticatedIdle, no clamping).
type Limits struct {
	Max                 int
	MaxPerAddr          int
	MaxUnauthenticated  int
	UnauthenticatedIdle time.Duration
}

// DefaultUnauthenticatedIdle is how long an unauthenticated connection may
// stay idle (or take over a request) in DefaultLimits.
const DefaultUnauthenticatedIdle = 10 * time.Second

// DefaultLimits derives limits from the process's open-file limit nofile:
// a reserve of a quarter of it (at least 256, or half of a limit below
// 512) stays free for the unix socket, the sandboxes and the store; half
// of the rest may be unauthenticated; one address may hold a quarter of
// it, at most 256.
func DefaultLimits(nofile uint64) Limits {
	reserve := max(nofile/4, 256)
	if nofile < 2*reserve {
		reserve = nofile / 2
	}
	n := int(min(nofile-reserve, 1<<20))
	return Limits{
		Max:                 n,
		MaxPerAddr:          max(min(n/4, 256), 1),
		MaxUnauthenticated:  max(n/2, 1),
		UnauthenticatedIdle: DefaultUnauthenticatedIdle,
	}
}

// Listener applies Limits to the connections of an inner listener. It is
// safe for concurrent use; Accept is meant to be called from one loop.
type Listener struct {
	net.Listener
	lim Limits
	log *slog.Logger

	// mu guards the fields below.
	mu      sync.Mutex
	total   int
	perAddr map[netip.Addr]int
	unauth  *list.List // of *Conn, oldest first
}

// NewListener wraps inner. log receives one line per refused or evicted
// connection at debug level; nil discards them.
func NewListener(inner net.Listener, lim Limits, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: inner, lim: lim, log: log, perAddr: map[netip.Addr]int{}, unauth: list.New()}
}

// Accept returns the next connection within the limits, closing the ones
// over them. Errors of the inner listener are returned unchanged.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit counts nc in, evicting the oldest unauthenticated connection when
// a cap demands it, or closes nc and returns nil.
func (l *Listener) admit(nc net.Conn) *Conn {
	addr := clientKey(nc.RemoteAddr())
	c := &Conn{Conn: nc, l: l, addr: addr}
	var victim *Conn
	l.mu.Lock()
	if l.lim.MaxPerAddr > 0 && l.perAddr[addr] >= l.lim.MaxPerAddr {
		l.mu.Unlock()
		l.log.Debug("connection refused: too many from its address", "remote", nc.RemoteAddr().String(), "max_per_addr", l.lim.MaxPerAddr)
		nc.Close()
		return nil
	}
	overTotal := l.lim.Max > 0 && l.total >= l.lim.Max
	overUnauth := l.lim.MaxUnauthenticated > 0 && l.unauth.Len() >= l.lim.MaxUnauthenticated
	if overTotal || overUnauth {
		front := l.unauth.Front()
		if front == nil {
			// Every connection is authenticated: they keep their places.
			l.mu.Unlock()
			l.log.Debug("connection refused: at the connection limit", "remote", nc.RemoteAddr().String(), "max", l.lim.Max)
			nc.Close()
			return nil
		}
		victim = front.Value.(*Conn)
		l.forgetLocked(victim)
	}
	l.total++
	l.perAddr[addr]++
	c.elem = l.unauth.PushBack(c)
	c.counted = true
	l.mu.Unlock()
	if victim != nil {
		l.log.Debug("evicting the oldest unauthenticated connection", "remote", victim.RemoteAddr().String())
		victim.Conn.Close()
	}
	if l.lim.UnauthenticatedIdle > 0 {
		_ = nc.SetReadDeadline(time.Now().Add(l.lim.UnauthenticatedIdle))
	}
	return c
}

// forgetLocked removes c from the counts (once).
func (l *Listener) forgetLocked(c *Conn) {
	if !c.counted {
		return
	}
	c.counted = false
	l.total--
	if n := l.perAddr[c.addr] - 1; n > 0 {
		l.perAddr[c.addr] = n
	} else {
		delete(l.perAddr, c.addr)
	}
	if c.elem != nil {
		l.unauth.Remove(c.elem)
		c.elem = nil
	}
}

// Stats are a Listener's current counts.
type Stats struct {
	Total, Unauthenticated, Addrs int
}

// Stats returns the current counts.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Total: l.total, Unauthenticated: l.unauth.Len(), Addrs: len(l.perAddr)}
}

// clientKey is the address a client is counted by: its IP, or for IPv6
// its /64 (one host usually holds a whole /64).
func clientKey(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// Conn is a connection accepted by a Listener.
type Conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr

	// l.mu guards the fields below.
	counted bool
	elem    *list.Element // in l.unauth while unauthenticated
	wanted  time.Time     // the read deadline last asked for
}

// Close closes the connection and releases its place. It may be called
// more than once.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// SetReadDeadline sets the read deadline; while c is unauthenticated it is
// clamped to UnauthenticatedIdle from now.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.clamp(t))
}

// SetDeadline sets both deadlines; the read deadline is clamped as by
// SetReadDeadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(c.clamp(t))
}

func (c *Conn) clamp(t time.Time) time.Time {
	idle := c.l.lim.UnauthenticatedIdle
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.wanted = t
	if c.elem == nil || idle <= 0 {
		return t
	}
	if limit := time.Now().Add(idle); t.IsZero() || t.After(limit) {
		return limit
	}
	return t
}

// markAuthenticated takes c off the unauthenticated list and restores the
// read deadline last asked for.
func (c *Conn) markAuthenticated() {
	c.l.mu.Lock()
	if c.elem == nil {
		c.l.mu.Unlock()
		return
	}
	c.l.unauth.Remove(c.elem)
	c.elem = nil
	wanted := c.wanted
	c.l.mu.Unlock()
	_ = c.Conn.SetReadDeadline(wanted)
}

type connKey struct{}

// WithConn returns ctx carrying the Conn under nc (nc itself, or the
// connection a *tls.Conn or another wrapper with a NetConn method wraps).
// Use it as http.Server.ConnContext. A context without a Conn is returned
// unchanged.
func WithConn(ctx context.Context, nc net.Conn) context.Context {
	for nc != nil {
		if c, ok := nc.(*Conn); ok {
			return context.WithValue(ctx, connKey{}, c)
		}
		w, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = w.NetConn()
	}
	return ctx
}

// MarkAuthenticated records that a request on the connection of ctx (see
// WithConn) authenticated: it no longer counts as unauthenticated, is
// never evicted and its read deadlines are no longer clamped. It does
// nothing for a context without a Conn (e.g. the unix socket).
func MarkAuthenticated(ctx context.Context) {
	if c, ok := ctx.Value(connKey{}).(*Conn); ok {
		c.markAuthenticated()
	}
}

var (
	_ net.Listener = (*Listener)(nil)
	_ net.Conn     = (*Conn)(nil)
)
