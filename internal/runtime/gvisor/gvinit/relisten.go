package gvinit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Memory checkpoints (runsc checkpoint) cannot save a sentry that holds a
// host socket: neither the listening socket the gofer made for the guest
// (--host-uds=create; the sentry panics "Cannot save endpoint with bound
// host socket") nor the host's connections to it. So before the backend
// saves a sandbox it asks the guest to let go of the host: on the control
// socket (CtlName, bound beside the guest socket and claimed by the host
// the same way, so only host root can reach it) it sends QuiesceRequest;
// the guest closes its listeners and every accepted connection, answers
// QuiesceReply and closes the control connection. From then on it tries
// to bind both sockets again every rebindInterval, which fails (EACCES)
// for as long as the host keeps the socket directory closed to the
// sandbox; the host opens it again after the save (the sandbox left
// running) or in the fresh bundle a restore starts from, and claims the
// new sockets as Create does. Nothing inside the sandbox can trigger a
// quiesce: the control socket is host root's, and the directory's
// permissions are the host's.

// CtlName is the control socket's name in SocketDir.
const CtlName = "ctl.sock"

// The control socket's commands (see auth.go for the exchange): a
// quiesce, answered QuiesceReply; a proof (ProveCommand).
const (
	QuiescePrefix = "quiesce "
	QuiesceReply  = "ok\n"
)

const rebindInterval = 2 * time.Millisecond

// relistener is the net.Listener the guest serves on: it survives its
// socket being closed for a save and bound again after it.
type relistener struct {
	mu     sync.Mutex
	cond   *sync.Cond
	ln     net.Listener // nil while quiesced
	gen    int          // bumped at every quiesce
	conns  map[*trackedConn]struct{}
	closed bool
	// nonce is the last quiesce's; while unproven (after a rebind, until
	// the host proved itself on a connection) no connection is served.
	nonce    string
	unproven bool
}

func newRelistener(ln net.Listener) *relistener {
	r := &relistener{ln: ln, conns: map[*trackedConn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Accept waits for a connection; while quiesced it waits for the socket
// to be bound again.
func (r *relistener) Accept() (net.Conn, error) {
	for {
		r.mu.Lock()
		for r.ln == nil && !r.closed {
			r.cond.Wait()
		}
		if r.closed {
			r.mu.Unlock()
			return nil, net.ErrClosed
		}
		ln, gen := r.ln, r.gen
		r.mu.Unlock()
		c, err := ln.Accept()
		r.mu.Lock()
		if r.gen != gen && !r.closed { // quiesced meanwhile
			r.mu.Unlock()
			if c != nil {
				c.Close()
			}
			continue
		}
		if err != nil {
			r.mu.Unlock()
			return nil, err
		}
		if !fromHost(c) {
			// A sandbox process reached the socket while its name was
			// in the sentry (the window of a rebind): never served,
			// never challenged (peer.go).
			r.mu.Unlock()
			c.Close()
			continue
		}
		if r.unproven {
			nonce := r.nonce
			r.mu.Unlock()
			if r.proveHost(c, nonce) {
				r.mu.Lock()
				if r.gen == gen {
					r.unproven = false
				}
				r.mu.Unlock()
			}
			c.Close()
			continue
		}
		tc := &trackedConn{Conn: c, r: r}
		r.conns[tc] = struct{}{}
		r.mu.Unlock()
		return tc, nil
	}
}

// Close closes the listener for good.
func (r *relistener) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.cond.Broadcast()
	if r.ln != nil {
		return r.ln.Close()
	}
	return nil
}

func (r *relistener) Addr() net.Addr {
	return &net.UnixAddr{Name: SocketPath, Net: "unix"}
}

// quiesce closes the listener and every connection accepted on it.
func (r *relistener) quiesce(nonce string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.nonce = nonce
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Conn.Close()
	}
	clear(r.conns)
}

// resume serves on ln again.
func (r *relistener) resume(ln net.Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		ln.Close()
		return
	}
	r.ln = ln
	r.unproven = true
	r.cond.Broadcast()
}

type trackedConn struct {
	net.Conn
	r *relistener
}

func (c *trackedConn) Close() error {
	c.r.mu.Lock()
	delete(c.r.conns, c)
	c.r.mu.Unlock()
	return c.Conn.Close()
}

// listen binds a unix socket at path that is not removed when closed
// (the host has moved it away by then).
func listen(path string) (*net.UnixListener, error) {
	// The sentry may hold a stale dentry at path (the host moved the
	// socket it names away): a lookup revalidates it first, so that the
	// bind below does not trip over it. A restored sandbox finds
	// placeholders of the host's there, which go.
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if errors.Is(err, unix.EADDRINUSE) {
		if uerr := unix.Unlink(path); uerr != nil {
			return nil, fmt.Errorf("%w (unlink: %w)", err, uerr)
		}
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// control serves the control socket: proofs on any connection of the
// host's, and one quiesce per bind. After a quiesce it
// binds both sockets again as soon as the host lets it and serves the next
// one.
func control(r *relistener, ctl *net.UnixListener) {
	for {
		c, err := ctl.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !fromHost(c) {
			c.Close()
			continue
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		r.mu.Lock()
		cur := r.nonce
		r.mu.Unlock()
		cmd, err := authenticate(c, bufio.NewReader(c), cur)
		if err != nil {
			c.Close()
			continue
		}
		if ch, ok := strings.CutPrefix(cmd, ProveCommand); ok {
			_, _ = io.WriteString(c, GuestProof(cur, ch)+"\n")
			c.Close()
			continue
		}
		nonce, isQuiesce := strings.CutPrefix(cmd, QuiescePrefix)
		if !isQuiesce || nonce == "" {
			c.Close()
			continue
		}
		r.quiesce(nonce)
		ctl.Close()
		_, _ = c.Write([]byte(QuiesceReply))
		c.Close()
		ln, nctl := rebind()
		r.resume(ln)
		ctl = nctl
	}
}

// rebind binds the guest socket and the control socket again, retrying
// until the host opens the socket directory to the sandbox.
func rebind() (*net.UnixListener, *net.UnixListener) {
	var ln *net.UnixListener
	last := ""
	for {
		var err error
		if ln == nil {
			ln, err = listen(SocketPath)
		}
		if err == nil {
			var ctl *net.UnixListener
			if ctl, err = listen(SocketDir + "/" + CtlName); err == nil {
				return ln, ctl
			}
			// Both again: the host may have claimed the socket files
			// of this attempt (a bind that failed in the sentry can
			// leave its file on the host) and will look for new ones.
			ln.Close()
			ln = nil
		}
		// EACCES while the host keeps the directory closed; anything
		// else goes to the guest log, once.
		if msg := err.Error(); msg != last {
			fmt.Fprintf(os.Stderr, "rebinding the guest socket: %v\n", err)
			last = msg
		}
		time.Sleep(rebindInterval)
	}
}

// proveHost runs the exchange of auth.go on c, a connection to the guest
// socket accepted after a rebind, and reports whether the host proved
// itself (the guest then answered its proof).
func (r *relistener) proveHost(c net.Conn, nonce string) bool {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	cmd, err := authenticate(c, bufio.NewReader(c), nonce)
	if err != nil || !strings.HasPrefix(cmd, ProveCommand) {
		return false
	}
	_, err = io.WriteString(c, GuestProof(nonce, strings.TrimPrefix(cmd, ProveCommand))+"\n")
	return err == nil
}
