package agentbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Result is how a command ended. A non-zero ExitCode is not an error.
type Result struct {
	Pid      int
	Stdout   []byte // collected output; nil when streamed to a writer
	Stderr   []byte
	ExitCode int    // -1 when killed by a signal
	Signal   string // e.g. "KILL" when killed by a signal
	TimedOut bool   // killed because its timeout expired
	// OOMKilled: killed by the sandbox's out-of-memory killer (its memory
	// limit was reached while the command ran).
	OOMKilled bool
	// Checkpoint is the id of the checkpoint taken before the command
	// (WithCheckpoint, WithRollbackOnFailure); RolledBack says the sandbox
	// was restored to it because the command failed.
	Checkpoint string
	RolledBack bool
}

// Streams says where a command's output goes while it runs.
type Streams struct {
	// Stdout and Stderr receive output as it arrives. A nil writer means the
	// stream is collected into the Result instead. With a TTY all output
	// arrives on Stdout.
	Stdout, Stderr io.Writer
	// Started, when set, is called once the daemon reports the process
	// started, before any output is written. It may keep p and use it
	// concurrently (WriteStdin, Resize, Signal) while the command runs.
	Started func(p *Process)
}

// ExecOption adjusts the request Run sends.
type ExecOption func(*api.ExecRequest)

// WithEnv adds environment variables, merged over the sandbox's.
func WithEnv(env map[string]string) ExecOption {
	return func(r *api.ExecRequest) {
		if r.Env == nil {
			r.Env = map[string]string{}
		}
		for k, v := range env {
			r.Env[k] = v
		}
	}
}

// WithCwd sets the working directory (absolute, inside the sandbox).
func WithCwd(dir string) ExecOption { return func(r *api.ExecRequest) { r.Cwd = dir } }

// WithPrivate runs the command private: no other process of the sandbox
// can read its environment or memory (api.ExecRequest.Private; implied by
// WithSecret and WithRunToken).
func WithPrivate() ExecOption { return func(r *api.ExecRequest) { r.Private = true } }

// WithUser runs the command as user (name or uid[:gid]).
func WithUser(user string) ExecOption { return func(r *api.ExecRequest) { r.User = user } }

// WithTimeout kills the command after d.
func WithTimeout(d time.Duration) ExecOption {
	return func(r *api.ExecRequest) { r.TimeoutSeconds = d.Seconds() }
}

// WithStdin gives the command data as its standard input (then EOF).
func WithStdin(data []byte) ExecOption { return func(r *api.ExecRequest) { r.Stdin = data } }

// Run runs command with "/bin/sh -c" and waits for it, collecting its
// output. The error is non-nil only when the command could not be run or
// followed to its end; check Result.ExitCode for its status.
func (s *Sandbox) Run(ctx context.Context, command string, opts ...ExecOption) (*Result, error) {
	req := api.ExecRequest{Command: command}
	for _, o := range opts {
		o(&req)
	}
	return s.Exec(ctx, req, Streams{})
}

// Exec runs req and streams its output to st as it arrives, returning when
// the command exits. req.Background is ignored (use Start).
func (s *Sandbox) Exec(ctx context.Context, req api.ExecRequest, st Streams) (*Result, error) {
	req.Background = false
	resp, err := s.c.send(ctx, request{method: http.MethodPost, path: s.path("/exec"), json: req})
	if err != nil {
		return nil, wrapf(err, "exec in sandbox %s", s.id)
	}
	defer resp.Body.Close()
	res, err := s.follow(resp.Body, 0, st)
	if err != nil {
		return res, wrapf(err, "exec in sandbox %s", s.id)
	}
	return res, nil
}

// Start runs req in the background and returns at once. Follow its output
// with Attach (the daemon buffers it), feed it with WriteStdin when
// req.StdinOpen is set.
func (s *Sandbox) Start(ctx context.Context, req api.ExecRequest) (*Process, error) {
	req.Background = true
	var p api.Process
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/exec"), json: req}, &p); err != nil {
		return nil, wrapf(err, "starting process in sandbox %s", s.id)
	}
	return &Process{sb: s, pid: p.Pid, info: p}, nil
}

// Attach follows the process pid until it exits, streaming its output to st.
// With replay, output buffered since it started is written first.
func (s *Sandbox) Attach(ctx context.Context, pid int, replay bool, st Streams) (*Result, error) {
	q := url.Values{"replay": {strconv.FormatBool(replay)}}
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.procPath(pid, "/attach"), query: q})
	if err != nil {
		return nil, wrapf(err, "attaching to process %d in sandbox %s", pid, s.id)
	}
	defer resp.Body.Close()
	res, err := s.follow(resp.Body, pid, st)
	if err != nil {
		return res, wrapf(err, "attaching to process %d in sandbox %s", pid, s.id)
	}
	return res, nil
}

// Processes lists the processes started through exec, running or exited.
func (s *Sandbox) Processes(ctx context.Context) ([]api.Process, error) {
	var list api.ProcessList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/processes")}, &list); err != nil {
		return nil, wrapf(err, "listing processes of sandbox %s", s.id)
	}
	return list.Processes, nil
}

// Process returns a handle on the process pid without contacting the daemon.
func (s *Sandbox) Process(pid int) *Process {
	return &Process{sb: s, pid: pid, info: api.Process{Pid: pid}}
}

// follow reads an exec or attach stream to its final event.
func (s *Sandbox) follow(body io.Reader, pid int, st Streams) (*Result, error) {
	var outBuf, errBuf *bytes.Buffer
	stdout, stderr := st.Stdout, st.Stderr
	if stdout == nil {
		outBuf = &bytes.Buffer{}
		stdout = outBuf
	}
	if stderr == nil {
		errBuf = &bytes.Buffer{}
		stderr = errBuf
	}
	res := &Result{Pid: pid}
	collect := func() {
		if outBuf != nil {
			res.Stdout = outBuf.Bytes()
		}
		if errBuf != nil {
			res.Stderr = errBuf.Bytes()
		}
	}
	started := false
	start := func(p int) {
		if started {
			return
		}
		started = true
		if p != 0 {
			res.Pid = p
		}
		if st.Started != nil {
			st.Started(&Process{sb: s, pid: res.Pid, info: api.Process{Pid: res.Pid, Running: true}})
		}
	}
	if pid != 0 { // attach: the process is known before any event
		start(pid)
	}

	dec := newNDJSON(body)
	for {
		var ev api.ExecEvent
		if err := dec.next(&ev); err != nil {
			collect()
			return res, truncated("reading output", err)
		}
		switch ev.Type {
		case api.EventStarted:
			start(ev.Pid)
		case api.EventStdout, api.EventStderr:
			start(ev.Pid)
			w := stdout
			if ev.Type == api.EventStderr {
				w = stderr
			}
			if _, err := w.Write(ev.Data); err != nil {
				collect()
				return res, wrapf(err, "writing %s", ev.Type)
			}
		case api.EventExit:
			collect()
			res.ExitCode = -1
			if ev.ExitCode != nil {
				res.ExitCode = *ev.ExitCode
			}
			res.Signal, res.TimedOut, res.OOMKilled = ev.Signal, ev.TimedOut, ev.OOMKilled
			res.Checkpoint, res.RolledBack = ev.Checkpoint, ev.RolledBack
			return res, nil
		case api.EventError:
			collect()
			return res, streamError(ev.Error)
		default:
			// Unknown event types come from a newer daemon; skip them.
		}
	}
}

// Process is a handle on a process started through exec. Its methods are
// safe for concurrent use, including while an Exec or Attach follows it.
type Process struct {
	sb   *Sandbox
	pid  int
	info api.Process
}

// Pid returns the process id inside the sandbox.
func (p *Process) Pid() int { return p.pid }

// Info returns the description the daemon gave when the process started.
func (p *Process) Info() api.Process { return p.info }

// Sandbox returns the sandbox the process runs in.
func (p *Process) Sandbox() *Sandbox { return p.sb }

// Signal sends sig ("TERM", "KILL", "INT", ... or a number) to the process.
func (p *Process) Signal(ctx context.Context, sig string) error {
	err := p.sb.c.call(ctx, request{method: http.MethodPost, path: p.sb.procPath(p.pid, "/signal"), json: api.SignalRequest{Signal: sig}}, nil)
	if err != nil {
		return wrapf(err, "signalling process %d in sandbox %s", p.pid, p.sb.id)
	}
	return nil
}

// Resize changes the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, rows, cols uint16) error {
	err := p.sb.c.call(ctx, request{method: http.MethodPost, path: p.sb.procPath(p.pid, "/resize"), json: api.ResizeRequest{Rows: rows, Cols: cols}}, nil)
	if err != nil {
		return wrapf(err, "resizing terminal of process %d in sandbox %s", p.pid, p.sb.id)
	}
	return nil
}

// WriteStdin streams r to the process's standard input until r's EOF, then
// closes that input when close is set. The process must have been started
// with StdinOpen. r is streamed, never buffered whole.
func (p *Process) WriteStdin(ctx context.Context, r io.Reader, close bool) error {
	q := url.Values{"close": {strconv.FormatBool(close)}}
	err := p.sb.c.call(ctx, request{method: http.MethodPost, path: p.sb.procPath(p.pid, "/stdin"), query: q,
		body: r, ctype: "application/octet-stream", size: -1}, nil)
	if err != nil {
		return wrapf(err, "writing stdin of process %d in sandbox %s", p.pid, p.sb.id)
	}
	return nil
}

// Attach follows the process until it exits; see Sandbox.Attach.
func (p *Process) Attach(ctx context.Context, replay bool, st Streams) (*Result, error) {
	return p.sb.Attach(ctx, p.pid, replay, st)
}

func (s *Sandbox) procPath(pid int, sub string) string {
	return s.path("/processes/" + strconv.Itoa(pid) + sub)
}

// WithOutputSchema makes the daemon validate the command's stdout against
// schema, a JSON Schema document (api.ExecRequest.OutputSchema): Run then
// returns the output only when it conforms, and otherwise an *APIError with
// Code "failed_precondition" and Reason ReasonOutputSchemaMismatch
// (IsOutputSchemaMismatch) instead of the raw text.
func WithOutputSchema(schema []byte) ExecOption {
	return func(r *api.ExecRequest) { r.OutputSchema = append([]byte(nil), schema...) }
}

// Reasons of output schema errors (Error.Reason).
const (
	ReasonOutputSchemaMismatch = "output_schema_mismatch"
	ReasonOutputTooLarge       = "output_too_large"
)

// IsOutputSchemaMismatch reports whether err is a command's stdout that did
// not conform to its WithOutputSchema (or was too large to validate).
func IsOutputSchemaMismatch(err error) bool {
	var e *APIError
	return errors.As(err, &e) && (e.Reason == ReasonOutputSchemaMismatch || e.Reason == ReasonOutputTooLarge)
}
