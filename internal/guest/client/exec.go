package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"unicode"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// maxPid is the largest pid Linux hands out (PID_MAX_LIMIT).
const maxPid = 1 << 22

// Stream is the event stream of one exec or attach. Next and the Stdin
// writer may be used from different goroutines; Next itself is not safe
// for concurrent use.
type Stream struct {
	w       *wire
	pid     int
	tty     bool
	pending *api.ExecEvent // the started event, returned first
	done    bool
	err     error // sticky error of Next

	// wmu serialises frames written to the guest.
	wmu sync.Mutex
}

// Pid is the process's pid inside the sandbox.
func (s *Stream) Pid() int { return s.pid }

// Next returns the next event: "started" first, then "stdout"/"stderr",
// then exactly one "exit" or "error", after which it returns io.EOF. Any
// other error means the stream broke (protocol violation, context expiry).
func (s *Stream) Next() (api.ExecEvent, error) {
	if s.pending != nil {
		ev := *s.pending
		s.pending = nil
		return ev, nil
	}
	if s.done {
		return api.ExecEvent{}, io.EOF
	}
	if s.err != nil {
		return api.ExecEvent{}, s.err
	}
	ev, err := s.next()
	if err != nil {
		s.err = err
		return api.ExecEvent{}, err
	}
	if ev.Type == api.EventExit || ev.Type == api.EventError {
		s.done = true
	}
	return ev, nil
}

func (s *Stream) next() (api.ExecEvent, error) {
	t, b, err := proto.ReadFrame(s.w.br)
	if err != nil {
		return api.ExecEvent{}, s.w.err(err)
	}
	switch t {
	case proto.FrameStdout:
		return api.ExecEvent{Type: api.EventStdout, Pid: s.pid, Data: b}, nil
	case proto.FrameStderr:
		if s.tty {
			return api.ExecEvent{}, protoErr("stderr frame on a TTY stream")
		}
		return api.ExecEvent{Type: api.EventStderr, Pid: s.pid, Data: b}, nil
	case proto.FrameExit:
		var ex proto.Exit
		if err := json.Unmarshal(b, &ex); err != nil {
			return api.ExecEvent{}, protoErr("undecodable exit frame: %v", err)
		}
		if err := validExit(ex); err != nil {
			return api.ExecEvent{}, err
		}
		code := ex.ExitCode
		return api.ExecEvent{Type: api.EventExit, Pid: s.pid, ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut}, nil
	case proto.FrameError:
		var e proto.Error
		if err := json.Unmarshal(b, &e); err != nil {
			return api.ExecEvent{}, protoErr("undecodable error frame: %v", err)
		}
		err := e.Err()
		return api.ExecEvent{Type: api.EventError, Pid: s.pid, Error: &api.Error{Code: errdefs.Code(err), Message: err.Error()}}, nil
	}
	return api.ExecEvent{}, protoErr("unexpected %s frame in exec stream", t)
}

func validExit(ex proto.Exit) error {
	switch {
	case ex.ExitCode < -1 || ex.ExitCode > 255:
		return protoErr("exit code %d out of range", ex.ExitCode)
	case ex.ExitCode == -1 && !validSignalName(ex.Signal):
		return protoErr("killed by invalid signal %q", ex.Signal)
	case ex.ExitCode >= 0 && ex.Signal != "":
		return protoErr("exit code %d with signal %q", ex.ExitCode, ex.Signal)
	}
	return nil
}

func validSignalName(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for _, r := range s {
		if !(unicode.IsUpper(r) || unicode.IsDigit(r) || r == '+' || r == '-') || r > unicode.MaxASCII {
			return false
		}
	}
	return true
}

// Close ends the stream. The process keeps running in the sandbox.
func (s *Stream) Close() error {
	return s.w.close()
}

// writeFrame sends one control frame.
func (s *Stream) writeFrame(t proto.FrameType, b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := proto.WriteFrame(s.w.bw, t, b); err != nil {
		return s.w.err(err)
	}
	if err := s.w.bw.Flush(); err != nil {
		return s.w.err(err)
	}
	return nil
}

// Stdin returns a writer to the process's stdin on this stream's
// connection (for exec with stdin_open). Close closes the process's stdin
// (with a TTY it sends end-of-file, ^D).
func (s *Stream) Stdin() io.WriteCloser { return stdinWriter{s} }

type stdinWriter struct{ s *Stream }

func (w stdinWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), proto.ChunkSize)
		if err := w.s.writeFrame(proto.FrameStdin, b[:k]); err != nil {
			return n, err
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

func (w stdinWriter) Close() error { return w.s.writeFrame(proto.FrameCloseStdin, nil) }

// Resize changes the TTY size of the process over this stream.
func (s *Stream) Resize(tty api.TTY) error {
	b, _ := json.Marshal(tty)
	return s.writeFrame(proto.FrameResize, b)
}

// Signal sends a signal to the process group over this stream.
func (s *Stream) Signal(sig string) error {
	return s.writeFrame(proto.FrameSignal, []byte(sig))
}

// openStream sends req and reads the Started frame.
func (c *Client) openStream(ctx context.Context, req *proto.Request) (*Stream, error) {
	w, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	t, b, err := w.frame()
	if err != nil {
		w.close()
		return nil, err
	}
	if t != proto.FrameStarted {
		w.close()
		return nil, protoErr("%s: unexpected %s frame, want started", req.Op, t)
	}
	var st proto.Started
	if err := json.Unmarshal(b, &st); err != nil {
		w.close()
		return nil, protoErr("%s: undecodable started frame: %v", req.Op, err)
	}
	if st.Pid <= 0 || st.Pid > maxPid || (req.Op == proto.OpAttach && st.Pid != req.Pid) {
		w.close()
		return nil, protoErr("%s: invalid pid %d", req.Op, st.Pid)
	}
	return &Stream{w: w, pid: st.Pid, tty: st.TTY, pending: &api.ExecEvent{Type: api.EventStarted, Pid: st.Pid}}, nil
}

// Exec starts a process and attaches to it on the same connection; the
// stream's first event is "started". req.Background is ignored (use Start).
// Closing the stream before the exit leaves the process running.
func (c *Client) Exec(ctx context.Context, req api.ExecRequest) (*Stream, error) {
	return c.openStream(ctx, &proto.Request{Op: proto.OpExec, Exec: &req})
}

// Attach attaches to a process started earlier. With replay, its buffered
// output (the newest bytes, up to the guest's buffer size) comes first. A
// process that has exited yields started, the replay, and exit.
func (c *Client) Attach(ctx context.Context, pid int, replay bool) (*Stream, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	return c.openStream(ctx, &proto.Request{Op: proto.OpAttach, Pid: pid, Replay: replay})
}

// Start starts a process in the background and returns at once.
func (c *Client) Start(ctx context.Context, req api.ExecRequest) (api.Process, error) {
	var p api.Process
	if err := c.call(ctx, &proto.Request{Op: proto.OpStart, Exec: &req}, &p); err != nil {
		return api.Process{}, err
	}
	if err := validProcess(p); err != nil {
		return api.Process{}, err
	}
	return p, nil
}

func validProcess(p api.Process) error {
	switch {
	case p.Pid <= 0 || p.Pid > maxPid:
		return protoErr("process with pid %d", p.Pid)
	case p.Running && p.ExitCode != nil:
		return protoErr("running process %d with an exit code", p.Pid)
	case p.ExitCode != nil && (*p.ExitCode < -1 || *p.ExitCode > 255):
		return protoErr("process %d with exit code %d", p.Pid, *p.ExitCode)
	}
	return nil
}

// Processes lists the processes started through the guest, running and
// recently exited.
func (c *Client) Processes(ctx context.Context) ([]api.Process, error) {
	var ps []api.Process
	if err := c.call(ctx, &proto.Request{Op: proto.OpProcesses}, &ps); err != nil {
		return nil, err
	}
	for _, p := range ps {
		if err := validProcess(p); err != nil {
			return nil, err
		}
	}
	if ps == nil {
		ps = []api.Process{}
	}
	return ps, nil
}

// Activity reports how many processes live in the sandbox besides the
// guest (proto.OpActivity). A guest older than the operation answers an
// error wrapping errdefs.ErrNotImplemented.
func (c *Client) Activity(ctx context.Context) (proto.ActivityReply, error) {
	var r proto.ActivityReply
	if err := c.call(ctx, &proto.Request{Op: proto.OpActivity}, &r); err != nil {
		return proto.ActivityReply{}, err
	}
	if r.Processes < 0 || r.Processes > maxPid || len(r.Sample) > proto.MaxActivitySample || r.PrivateExecs < 0 {
		return proto.ActivityReply{}, protoErr("activity of %d processes with %d samples", r.Processes, len(r.Sample))
	}
	for _, s := range r.Sample {
		if len(s) > 64 {
			return proto.ActivityReply{}, protoErr("activity sample of %d bytes", len(s))
		}
	}
	return r, nil
}

// WriteStdin streams r to the stdin of process pid; with closeAfter the
// process's stdin is closed afterwards. r is not read after return.
func (c *Client) WriteStdin(ctx context.Context, pid int, r io.Reader, closeAfter bool) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpStdin, Pid: pid, CloseStdin: closeAfter})
	if err != nil {
		return err
	}
	defer w.close()
	if r == nil {
		r = bytes.NewReader(nil)
	}
	return w.upload(proto.FrameStdin, r, nil)
}

// Signal sends sig ("TERM", "SIGKILL", "9", ...) to the process group of
// pid.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	return c.call(ctx, &proto.Request{Op: proto.OpSignal, Pid: pid, Signal: sig}, nil)
}

// Resize sets the TTY size of process pid.
func (c *Client) Resize(ctx context.Context, pid int, tty api.TTY) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	return c.call(ctx, &proto.Request{Op: proto.OpResize, Pid: pid, TTY: &tty}, nil)
}
