// Package client is the host-side client of the in-sandbox guest (package
// guest), speaking the wire protocol of package proto over the guest's unix
// socket: one connection per call.
//
// Everything the guest says is untrusted (a sandboxed user can replace the
// guest): frame and header sizes are bounded, every decoded value is
// validated, and a malformed reply never panics; it becomes an error
// wrapping errdefs.ErrUnavailable ("guest protocol error"). Errors the guest
// reports wrap the errdefs category it named; context expiry wraps
// errdefs.ErrDeadlineExceeded (or ErrUnavailable when cancelled).
//
// A Client is safe for concurrent use.
package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// Client talks to one guest.
type Client struct {
	socketPath  string
	dialTimeout time.Duration
	maxEntries  int
}

// Option configures a Client.
type Option func(*Client)

// WithDialTimeout bounds connecting when the context has no earlier
// deadline (default 5s).
func WithDialTimeout(d time.Duration) Option { return func(c *Client) { c.dialTimeout = d } }

// WithMaxListEntries bounds the entries List accepts (default 1,000,000).
func WithMaxListEntries(n int) Option { return func(c *Client) { c.maxEntries = n } }

// New returns a client of the guest listening on socketPath. It does not
// connect: every call dials a fresh connection.
func New(socketPath string, opts ...Option) *Client {
	c := &Client{socketPath: socketPath, dialTimeout: 5 * time.Second, maxEntries: 1_000_000}
	for _, o := range opts {
		o(c)
	}
	return c
}

// protoErr is a violation of the protocol by the guest.
func protoErr(format string, args ...any) error {
	return fmt.Errorf("guest protocol error: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrUnavailable)
}

// wire is one call's connection.
type wire struct {
	ctx  context.Context
	op   string
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	stop func() bool
}

// open dials the guest and sends the request header.
func (c *Client) open(ctx context.Context, req *proto.Request) (*wire, error) {
	req.V = proto.Version
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "unix", c.socketPath)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxErr(ctx, req.Op)
		}
		return nil, fmt.Errorf("connecting to guest: %v: %w", err, errdefs.ErrUnavailable)
	}
	w := &wire{ctx: ctx, op: req.Op, conn: conn, br: bufio.NewReaderSize(conn, 16<<10), bw: bufio.NewWriterSize(conn, 16<<10)}
	// Expiry of ctx unblocks every read and write on the connection.
	w.stop = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	if err := proto.WriteRequest(w.bw, req); err != nil {
		w.close()
		if errdefs.Code(err) != "internal" {
			return nil, fmt.Errorf("guest %s: %w", req.Op, err)
		}
		return nil, w.err(err)
	}
	if err := w.bw.Flush(); err != nil {
		w.close()
		return nil, w.err(err)
	}
	return w, nil
}

func (w *wire) close() error {
	w.stop()
	return w.conn.Close()
}

func ctxErr(ctx context.Context, op string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("guest %s: %w (%w)", op, errdefs.ErrDeadlineExceeded, ctx.Err())
	}
	return fmt.Errorf("guest %s: %w (%w)", op, errdefs.ErrUnavailable, ctx.Err())
}

// err classifies an error met on the connection.
func (w *wire) err(err error) error {
	var re *proto.RemoteError
	switch {
	case errors.As(err, &re):
		return fmt.Errorf("guest %s: %w", w.op, err)
	case w.ctx.Err() != nil:
		return ctxErr(w.ctx, w.op)
	case errors.Is(err, proto.ErrFrame), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return protoErr("%s: %v", w.op, err)
	case errdefs.IsUnavailable(err):
		return err
	}
	return fmt.Errorf("guest %s: %v: %w", w.op, err, errdefs.ErrUnavailable)
}

// errorFrame decodes the payload of an Error frame.
func errorFrame(b []byte) error {
	var e proto.Error
	if err := json.Unmarshal(b, &e); err != nil {
		return protoErr("undecodable error frame: %v", err)
	}
	return e.Err()
}

// frame reads the next frame, turning an Error frame into its error.
func (w *wire) frame() (proto.FrameType, []byte, error) {
	t, b, err := proto.ReadFrame(w.br)
	if err != nil {
		return 0, nil, w.err(err)
	}
	if t == proto.FrameError {
		return 0, nil, w.err(errorFrame(b))
	}
	return t, b, nil
}

// result reads a Result frame into v (nil: any payload is accepted).
func (w *wire) result(v any) error {
	t, b, err := w.frame()
	if err != nil {
		return err
	}
	if t != proto.FrameResult {
		return protoErr("%s: unexpected %s frame, want result", w.op, t)
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return protoErr("%s: undecodable result: %v", w.op, err)
	}
	return nil
}

// call runs a request whose answer is a single Result.
func (c *Client) call(ctx context.Context, req *proto.Request, v any) error {
	w, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer w.close()
	return w.result(v)
}

// upload sends r as frames of type t followed by EOF while waiting for the
// Result, which the guest may send early (an error) before reading it all.
func (w *wire) upload(t proto.FrameType, r io.Reader, v any) error {
	sent := make(chan error, 1)
	go func() {
		err := w.send(t, r)
		if err != nil {
			_ = w.conn.SetDeadline(time.Unix(1, 0)) // unblock the result read
		}
		sent <- err
	}()
	resErr := w.result(v)
	if resErr != nil {
		// Unblock the sender, then wait: r must not be read after return.
		_ = w.conn.SetDeadline(time.Unix(1, 0))
		if serr := <-sent; serr != nil {
			var src errSource
			if errors.As(serr, &src) {
				return fmt.Errorf("guest %s: %w", w.op, serr)
			}
		}
		return resErr
	}
	return <-sent
}

// errSource marks an error reading the caller's reader.
type errSource struct{ err error }

func (e errSource) Error() string { return "reading upload: " + e.err.Error() }
func (e errSource) Unwrap() error { return e.err }

func (w *wire) send(t proto.FrameType, r io.Reader) error {
	buf := make([]byte, proto.ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := proto.WriteFrame(w.bw, t, buf[:n]); err != nil {
				return w.err(err)
			}
			// Flush each frame: an interactive stdin must reach the
			// process as it is typed, not when a buffer fills.
			if err := w.bw.Flush(); err != nil {
				return w.err(err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return errSource{rerr}
		}
	}
	if err := proto.WriteFrame(w.bw, proto.FrameEOF, nil); err != nil {
		return w.err(err)
	}
	if err := w.bw.Flush(); err != nil {
		return w.err(err)
	}
	return nil
}

// Version returns the guest's version string.
func (c *Client) Version(ctx context.Context) (string, error) {
	var rep proto.VersionReply
	if err := c.call(ctx, &proto.Request{Op: proto.OpVersion}, &rep); err != nil {
		return "", err
	}
	if len(rep.Version) > 256 {
		return "", protoErr("version string of %d bytes", len(rep.Version))
	}
	if rep.Protocol <= 0 {
		return "", protoErr("version reply without protocol")
	}
	if rep.Protocol != proto.Version {
		return "", fmt.Errorf("guest speaks protocol %d, want %d: %w", rep.Protocol, proto.Version, errdefs.ErrFailedPrecondition)
	}
	return rep.Version, nil
}
