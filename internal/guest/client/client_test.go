package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

var fakeSeq atomic.Int64

// fakeGuest answers every connection by reading the request header and
// writing reply. With hold it then keeps the connection open (the client
// must give up at its deadline); otherwise it closes it.
func fakeGuest(t testing.TB, reply []byte, hold bool) string {
	t.Helper()
	addr := fmt.Sprintf("@agentbox-fake-guest-%d-%d", time.Now().UnixNano(), fakeSeq.Add(1))
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := proto.ReadRequest(c); err != nil {
					return
				}
				c.Write(reply)
				if hold {
					io.Copy(io.Discard, c)
				}
			}()
		}
	}()
	return addr
}

func frame(t proto.FrameType, payload string) []byte {
	var b bytes.Buffer
	proto.WriteFrame(&b, t, []byte(payload))
	return b.Bytes()
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// exercise runs every client call against addr; it must neither panic nor
// outlive its context by much.
func exercise(t testing.TB, addr string, timeout time.Duration) []error {
	c := New(addr)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	_, err := c.Version(ctx)
	add(err)
	if s, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"x"}}); err != nil {
		add(err)
	} else {
		for i := 0; ; i++ {
			_, err := s.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					add(err)
				}
				break
			}
			if i > 1<<16 {
				t.Fatal("stream does not end")
			}
		}
		s.Close()
	}
	_, err = c.Processes(ctx)
	add(err)
	_, err = c.Start(ctx, api.ExecRequest{Cmd: []string{"x"}})
	add(err)
	if rc, _, err := c.ReadFile(ctx, "/f"); err != nil {
		add(err)
	} else {
		_, err := io.Copy(io.Discard, rc)
		add(err)
		rc.Close()
	}
	_, err = c.List(ctx, "/d")
	add(err)
	if w, err := c.Watch(ctx, "/d", true); err != nil {
		add(err)
	} else {
		for i := 0; ; i++ {
			ev, err := w.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					add(err)
				}
				break
			}
			if validFSEvent(ev) != nil {
				t.Fatalf("watch passed on an invalid event %+v", ev)
			}
			if i > 1<<16 {
				t.Fatal("watch does not end")
			}
		}
		w.Close()
	}
	_, err = c.Stat(ctx, "/d")
	add(err)
	if rc, err := c.ReadArchive(ctx, "/d"); err != nil {
		add(err)
	} else {
		_, err := io.Copy(io.Discard, rc)
		add(err)
		rc.Close()
	}
	_, err = c.WriteFile(ctx, "/f", 0, false, bytes.NewReader(make([]byte, 100)))
	add(err)
	add(c.Signal(ctx, 5, "TERM"))
	return errs
}

// drain reads a stream or reader to its end and returns the first error.
func drainStream(s *Stream) error {
	defer s.Close()
	for {
		if _, err := s.Next(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

var calls = map[string]func(context.Context, *Client) error{
	"version": func(ctx context.Context, c *Client) error { _, err := c.Version(ctx); return err },
	"exec": func(ctx context.Context, c *Client) error {
		s, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"x"}})
		if err != nil {
			return err
		}
		return drainStream(s)
	},
	"processes": func(ctx context.Context, c *Client) error { _, err := c.Processes(ctx); return err },
	"stat":      func(ctx context.Context, c *Client) error { _, err := c.Stat(ctx, "/f"); return err },
	"list":      func(ctx context.Context, c *Client) error { _, err := c.List(ctx, "/d"); return err },
	"read": func(ctx context.Context, c *Client) error {
		rc, _, err := c.ReadFile(ctx, "/f")
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(io.Discard, rc)
		return err
	},
}

func TestMalformedGuest(t *testing.T) {
	huge := []byte{byte(proto.FrameResult), 0xff, 0xff, 0xff, 0xff}
	started := frame(proto.FrameStarted, `{"pid":5}`)
	cases := []struct {
		name, call string
		reply      []byte
	}{
		{"empty", "stat", nil},
		{"unknown frame", "stat", []byte{0x00, 0, 0, 0, 0}},
		{"oversized frame", "stat", huge},
		{"truncated frame", "stat", []byte{byte(proto.FrameResult), 0, 0, 0, 10, '{'}},
		{"garbage json", "stat", frame(proto.FrameResult, "{not json")},
		{"bad error frame", "stat", frame(proto.FrameError, "[1,2]")},
		{"version without protocol", "version", frame(proto.FrameResult, `{}`)},
		{"negative pid", "exec", frame(proto.FrameStarted, `{"pid":-1}`)},
		{"no started", "exec", frame(proto.FrameStdout, "x")},
		{"exit out of range", "exec", cat(started, frame(proto.FrameExit, `{"exit_code":1000}`))},
		{"bad signal", "exec", cat(started, frame(proto.FrameExit, `{"exit_code":-1,"signal":"k\u0000"}`))},
		{"stream ends early", "exec", cat(started, frame(proto.FrameStdout, "x"))},
		{"stderr on tty", "exec", cat(frame(proto.FrameStarted, `{"pid":5,"tty":true}`), frame(proto.FrameStderr, "x"))},
		{"result in stream", "exec", cat(started, frame(proto.FrameResult, "null"))},
		{"bad list entry", "list", cat(frame(proto.FrameResult, `[{"name":"a/b","path":"/d/a","type":"file"}]`), frame(proto.FrameEOF, ""))},
		{"dotdot list entry", "list", cat(frame(proto.FrameResult, `[{"name":"..","path":"/d","type":"dir"}]`), frame(proto.FrameEOF, ""))},
		{"list without eof", "list", frame(proto.FrameResult, `[]`)},
		{"negative size", "stat", frame(proto.FrameResult, `{"name":"f","path":"/f","type":"file","size":-5}`)},
		{"bad type", "stat", frame(proto.FrameResult, `{"name":"f","path":"/f","type":"weird"}`)},
		{"relative path", "stat", frame(proto.FrameResult, `{"name":"f","path":"f","type":"file"}`)},
		{"too much data", "read", cat(frame(proto.FrameResult, `{"name":"f","path":"/f","type":"file","size":1}`), frame(proto.FrameData, "abc"), frame(proto.FrameEOF, ""))},
		{"too little data", "read", cat(frame(proto.FrameResult, `{"name":"f","path":"/f","type":"file","size":10}`), frame(proto.FrameData, "abc"), frame(proto.FrameEOF, ""))},
		{"read of a dir", "read", frame(proto.FrameResult, `{"name":"f","path":"/f","type":"dir"}`)},
		{"bad process", "processes", frame(proto.FrameResult, `[{"pid":0}]`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeGuest(t, tc.reply, false)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := calls[tc.call](ctx, New(addr))
			if !errdefs.IsUnavailable(err) || ctx.Err() != nil {
				t.Fatalf("%s: %v, want a guest protocol error", tc.call, err)
			}
		})
	}
	// Every call against every corrupt reply: no panic, no hang.
	for _, tc := range cases {
		exercise(t, fakeGuest(t, tc.reply, false), 5*time.Second)
	}
}

func TestGuestErrorCategories(t *testing.T) {
	for code, want := range map[string]error{
		"not_found":          errdefs.ErrNotFound,
		"already_exists":     errdefs.ErrAlreadyExists,
		"permission_denied":  errdefs.ErrPermissionDenied,
		"resource_exhausted": errdefs.ErrResourceExhausted,
		"unauthenticated":    errdefs.ErrInternal, // a guest cannot claim this
		"made_up":            errdefs.ErrInternal,
	} {
		addr := fakeGuest(t, frame(proto.FrameError, fmt.Sprintf(`{"code":%q,"message":"m"}`, code)), false)
		_, err := New(addr).Stat(context.Background(), "/x")
		if !errors.Is(err, want) {
			t.Errorf("code %s: %v, want %v", code, err, want)
		}
	}
}

func TestHangingGuestHonoursDeadline(t *testing.T) {
	addr := fakeGuest(t, frame(proto.FrameStarted, `{"pid":5}`), true)
	start := time.Now()
	errs := exercise(t, addr, 300*time.Millisecond)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	if len(errs) == 0 || !errors.Is(errs[len(errs)-1], errdefs.ErrDeadlineExceeded) {
		t.Fatalf("errors %v", errs)
	}
}

func TestUnreachableGuest(t *testing.T) {
	_, err := New("@agentbox-nobody-listens-here").Version(context.Background())
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("%v", err)
	}
}

func FuzzClient(f *testing.F) {
	f.Add([]byte{})
	f.Add(frame(proto.FrameResult, `{"version":"x","protocol":1}`))
	f.Add(cat(frame(proto.FrameStarted, `{"pid":5}`), frame(proto.FrameStdout, "hi"), frame(proto.FrameExit, `{"exit_code":0}`)))
	f.Add(cat(frame(proto.FrameResult, `{"name":"f","path":"/f","type":"file","size":2}`), frame(proto.FrameData, "ab"), frame(proto.FrameEOF, "")))
	f.Add(cat(frame(proto.FrameResult, `[{"name":"a","path":"/d/a","type":"dir"}]`), frame(proto.FrameEOF, "")))
	f.Add(frame(proto.FrameError, `{"code":"not_found","message":"x"}`))
	f.Add(cat(frame(proto.FrameResult, "null"), frame(proto.FrameResult, `{"type":"create","path":"/d/a","name":"a"}`), frame(proto.FrameEOF, "")))
	f.Fuzz(func(t *testing.T, reply []byte) {
		if len(reply) > 0 && reply[0] == 0xAA {
			// Hold the connection open: the calls must end at the deadline.
			addr := fakeGuest(t, reply[1:], true)
			start := time.Now()
			exercise(t, addr, 50*time.Millisecond)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("took %v", d)
			}
			return
		}
		exercise(t, fakeGuest(t, reply, false), 2*time.Second)
	})
}

func TestFrameLimits(t *testing.T) {
	var b bytes.Buffer
	if err := proto.WriteFrame(&b, proto.FrameData, make([]byte, proto.MaxFrame+1)); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	hdr := make([]byte, 4)
	binary.BigEndian.PutUint32(hdr, proto.MaxHeader+1)
	if _, err := proto.ReadRequest(bytes.NewReader(hdr)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("oversized header: %v", err)
	}
}
