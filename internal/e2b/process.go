package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// The process.Process service: every command goes through Sandboxes.Exec
// (the pipeline), and the calls on a running one to the same process
// calls as agentbox's API (attach, stdin, signal, resize).

const processService = "/process.Process/"

// keepaliveHeader is the SDK's keepalive interval in seconds.
const keepaliveHeader = "Keepalive-Ping-Interval"

// defaultKeepalive is the keepalive interval when the header is absent.
const defaultKeepalive = 30 * time.Second

func (s *Server) processRoutes(mux *http.ServeMux, opts []connect.HandlerOption) {
	mux.Handle(processService+"Start", connect.NewServerStreamHandler(processService+"Start", s.start, opts...))
	mux.Handle(processService+"Connect", connect.NewServerStreamHandler(processService+"Connect", s.connectProcess, opts...))
	mux.Handle(processService+"List", connect.NewUnaryHandler(processService+"List", s.listProcesses, opts...))
	mux.Handle(processService+"SendInput", connect.NewUnaryHandler(processService+"SendInput", s.sendInput, opts...))
	mux.Handle(processService+"StreamInput", connect.NewClientStreamHandler(processService+"StreamInput", s.streamInput, opts...))
	mux.Handle(processService+"CloseStdin", connect.NewUnaryHandler(processService+"CloseStdin", s.closeStdin, opts...))
	mux.Handle(processService+"SendSignal", connect.NewUnaryHandler(processService+"SendSignal", s.sendSignal, opts...))
	mux.Handle(processService+"Update", connect.NewUnaryHandler(processService+"Update", s.update, opts...))
}

// processes remembers the tags E2B callers gave processes (PTYs and
// background commands are found by tag), per sandbox.
type processes struct {
	// mu guards tags.
	mu   sync.Mutex
	tags map[string]map[string]int // sandbox → tag → pid
}

func newProcesses() *processes { return &processes{tags: map[string]map[string]int{}} }

func (p *processes) setTag(sandbox, tag string, pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tags[sandbox] == nil {
		p.tags[sandbox] = map[string]int{}
	}
	p.tags[sandbox][tag] = pid
}

func (p *processes) pidOf(sandbox, tag string) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pid, ok := p.tags[sandbox][tag]
	return pid, ok
}

func (p *processes) tagOf(sandbox string, pid int) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, q := range p.tags[sandbox] {
		if q == pid {
			return t, true
		}
	}
	return "", false
}

// pidOf resolves a process selector in sandbox id.
func (s *Server) pidOf(id string, sel *processSelector) (int, error) {
	switch {
	case sel == nil:
		return 0, fmt.Errorf("no process selected: %w", errdefs.ErrInvalidArgument)
	case sel.Pid != nil && *sel.Pid > 0:
		return int(*sel.Pid), nil
	case sel.Tag != nil:
		if pid, ok := s.procs.pidOf(id, *sel.Tag); ok {
			return pid, nil
		}
		return 0, fmt.Errorf("process with tag %q: %w", *sel.Tag, errdefs.ErrNotFound)
	}
	return 0, fmt.Errorf("no process selected: %w", errdefs.ErrInvalidArgument)
}

// execRequest maps a StartRequest to agentbox's exec request for user.
func execRequest(req *startRequest, user string) (api.ExecRequest, error) {
	if req.Process == nil || req.Process.Cmd == "" {
		return api.ExecRequest{}, fmt.Errorf("process.cmd is required: %w", errdefs.ErrInvalidArgument)
	}
	cwd := homeOf(user)
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		var err error
		if cwd, err = resolvePath(*req.Process.Cwd, user); err != nil {
			return api.ExecRequest{}, err
		}
	}
	env := map[string]string{"HOME": homeOf(user), "USER": user}
	for k, v := range req.Process.Envs {
		env[k] = v
	}
	er := api.ExecRequest{
		Cmd:       append([]string{req.Process.Cmd}, req.Process.Args...),
		Env:       env,
		Cwd:       cwd,
		User:      user,
		StdinOpen: req.Stdin == nil || *req.Stdin,
	}
	if req.Pty != nil {
		er.TTY = &api.TTY{Rows: 24, Cols: 80}
		if sz := req.Pty.Size; sz != nil && sz.Rows > 0 && sz.Cols > 0 {
			er.TTY = &api.TTY{Rows: uint16(min(sz.Rows, 1<<15)), Cols: uint16(min(sz.Cols, 1<<15))}
		}
		er.StdinOpen = true
	}
	return er, nil
}

func (s *Server) start(ctx context.Context, req *connect.Request[startRequest], stream *connect.ServerStream[processEventResponse]) error {
	id := sandboxFrom(ctx)
	user, err := userOfHeader(req.Header())
	if err != nil {
		return connectError(err)
	}
	er, err := execRequest(req.Msg, user)
	if err != nil {
		return connectError(err)
	}
	st, err := s.sb.Exec(ctx, id, er)
	if err != nil {
		return connectError(err)
	}
	var tag string
	if req.Msg.Tag != nil {
		tag = *req.Msg.Tag
	}
	return s.pump(ctx, st, keepalive(req.Header()), er.TTY != nil, func(pid int) {
		if tag != "" {
			s.procs.setTag(id, tag, pid)
		}
	}, stream.Send)
}

func (s *Server) connectProcess(ctx context.Context, req *connect.Request[connectRequest], stream *connect.ServerStream[processEventResponse]) error {
	id := sandboxFrom(ctx)
	pid, err := s.pidOf(id, req.Msg.Process)
	if err != nil {
		return connectError(err)
	}
	tty := false
	if ps, err := s.sb.ListProcesses(ctx, id); err == nil {
		for _, p := range ps {
			if p.Pid == pid {
				tty = p.TTY
			}
		}
	}
	st, err := s.sb.Attach(ctx, id, pid, false)
	if err != nil {
		return connectError(err)
	}
	if err := stream.Send(&processEventResponse{Event: &processEvent{Start: &startEvent{Pid: uint32(pid)}}}); err != nil {
		st.Close()
		return err
	}
	return s.pump(ctx, st, keepalive(req.Header()), tty, nil, stream.Send)
}

// keepalive is the interval of keepalive events the client asked for.
func keepalive(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		return time.Duration(min(n, 3600)) * time.Second
	}
	return defaultKeepalive
}

type nextResult struct {
	ev  api.ExecEvent
	err error
}

// pump sends st's events as process events until the exit event, with a
// keepalive event after every interval without one. onStart sees the pid
// of a started event. The stream is closed on return; the process keeps
// running when the client goes away.
func (s *Server) pump(ctx context.Context, st execstream.Stream, interval time.Duration, tty bool, onStart func(int), send func(*processEventResponse) error) error {
	events := make(chan nextResult)
	done := make(chan struct{})
	defer func() {
		close(done)
		st.Close()
	}()
	go func() {
		for {
			ev, err := st.Next()
			select {
			case events <- nextResult{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		var pe *processEvent
		select {
		case <-ctx.Done():
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-t.C:
			pe = &processEvent{Keepalive: &empty{}}
		case r := <-events:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					return nil
				}
				return connectError(r.err)
			}
			var end bool
			pe, end = eventOf(r.ev, tty)
			if r.ev.Type == api.EventStarted && onStart != nil {
				onStart(r.ev.Pid)
			}
			if pe == nil {
				continue
			}
			if err := send(&processEventResponse{Event: pe}); err != nil {
				return err
			}
			if end {
				return nil
			}
			t.Reset(interval)
			continue
		}
		if err := send(&processEventResponse{Event: pe}); err != nil {
			return err
		}
		t.Reset(interval)
	}
}

// eventOf maps an exec event to a process event (nil: none), and says
// whether it is the last.
func eventOf(ev api.ExecEvent, tty bool) (*processEvent, bool) {
	switch ev.Type {
	case api.EventStarted:
		return &processEvent{Start: &startEvent{Pid: uint32(ev.Pid)}}, false
	case api.EventStdout:
		if tty {
			return &processEvent{Data: &dataEvent{Pty: ev.Data}}, false
		}
		return &processEvent{Data: &dataEvent{Stdout: ev.Data}}, false
	case api.EventStderr:
		return &processEvent{Data: &dataEvent{Stderr: ev.Data}}, false
	case api.EventExit:
		return &processEvent{End: endOf(ev)}, true
	case api.EventError:
		msg := "the process failed"
		if ev.Error != nil {
			msg = ev.Error.Message
		}
		return &processEvent{End: &endEvent{ExitCode: -1, Status: "error", Error: &msg}}, true
	}
	return nil, false
}

// endOf is the end event of an exit event, in the words of Go's
// os.ProcessState as envd reports it.
func endOf(ev api.ExecEvent) *endEvent {
	if ev.Signal != "" || ev.ExitCode == nil {
		e := &endEvent{ExitCode: -1, Status: "signal: " + signalWord(ev.Signal)}
		if ev.TimedOut {
			msg := "the process timed out"
			e.Error = &msg
		}
		return e
	}
	code := int32(*ev.ExitCode)
	return &endEvent{ExitCode: code, Exited: true, Status: "exit status " + strconv.Itoa(int(code))}
}

func signalWord(sig string) string {
	switch sig {
	case "KILL", "SIGKILL", "9":
		return "killed"
	case "TERM", "SIGTERM", "15":
		return "terminated"
	case "INT", "SIGINT", "2":
		return "interrupt"
	case "HUP", "SIGHUP", "1":
		return "hangup"
	case "":
		return "unknown"
	}
	return sig
}

func (s *Server) listProcesses(ctx context.Context, _ *connect.Request[empty]) (*connect.Response[listResponse], error) {
	id := sandboxFrom(ctx)
	ps, err := s.sb.ListProcesses(ctx, id)
	if err != nil {
		return nil, connectError(err)
	}
	out := &listResponse{Processes: []processInfo{}}
	for _, p := range ps {
		if !p.Running || len(p.Cmd) == 0 {
			continue
		}
		info := processInfo{Config: &processConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:]}, Pid: uint32(p.Pid)}
		if tag, ok := s.procs.tagOf(id, p.Pid); ok {
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// input returns the bytes of a ProcessInput (stdin or pty).
func input(in *processInput) []byte {
	if in == nil {
		return nil
	}
	if in.Pty != nil {
		return in.Pty
	}
	return in.Stdin
}

func (s *Server) sendInput(ctx context.Context, req *connect.Request[sendInputRequest]) (*connect.Response[empty], error) {
	id := sandboxFrom(ctx)
	pid, err := s.pidOf(id, req.Msg.Process)
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.sb.WriteStdin(ctx, id, pid, bytes.NewReader(input(req.Msg.Input)), false); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&empty{}), nil
}

func (s *Server) streamInput(ctx context.Context, stream *connect.ClientStream[streamInputRequest]) (*connect.Response[empty], error) {
	id := sandboxFrom(ctx)
	pid := 0
	for stream.Receive() {
		m := stream.Msg()
		switch {
		case m.Start != nil:
			p, err := s.pidOf(id, m.Start.Process)
			if err != nil {
				return nil, connectError(err)
			}
			pid = p
		case m.Data != nil:
			if pid == 0 {
				return nil, connectError(fmt.Errorf("input before the start event: %w", errdefs.ErrInvalidArgument))
			}
			if err := s.sb.WriteStdin(ctx, id, pid, bytes.NewReader(input(m.Data.Input)), false); err != nil {
				return nil, connectError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&empty{}), nil
}

func (s *Server) closeStdin(ctx context.Context, req *connect.Request[closeStdinRequest]) (*connect.Response[empty], error) {
	id := sandboxFrom(ctx)
	pid, err := s.pidOf(id, req.Msg.Process)
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.sb.WriteStdin(ctx, id, pid, bytes.NewReader(nil), true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&empty{}), nil
}

func (s *Server) sendSignal(ctx context.Context, req *connect.Request[sendSignalRequest]) (*connect.Response[empty], error) {
	id := sandboxFrom(ctx)
	pid, err := s.pidOf(id, req.Msg.Process)
	if err != nil {
		return nil, connectError(err)
	}
	var sig string
	switch req.Msg.Signal {
	case signalKill:
		sig = "KILL"
	case signalTerm:
		sig = "TERM"
	default:
		return nil, connectError(fmt.Errorf("signal %d: want SIGKILL or SIGTERM: %w", req.Msg.Signal, errdefs.ErrInvalidArgument))
	}
	if err := s.sb.Signal(ctx, id, pid, sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&empty{}), nil
}

func (s *Server) update(ctx context.Context, req *connect.Request[updateRequest]) (*connect.Response[empty], error) {
	id := sandboxFrom(ctx)
	pid, err := s.pidOf(id, req.Msg.Process)
	if err != nil {
		return nil, connectError(err)
	}
	if req.Msg.Pty != nil && req.Msg.Pty.Size != nil {
		sz := req.Msg.Pty.Size
		if sz.Rows == 0 || sz.Cols == 0 || sz.Rows > 1<<15 || sz.Cols > 1<<15 {
			return nil, connectError(fmt.Errorf("pty size %dx%d: %w", sz.Cols, sz.Rows, errdefs.ErrInvalidArgument))
		}
		if err := s.sb.Resize(ctx, id, pid, api.TTY{Rows: uint16(sz.Rows), Cols: uint16(sz.Cols)}); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&empty{}), nil
}
