package agentboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Sandbox is one fake sandbox. Its methods are safe for concurrent use.
type Sandbox struct {
	fs *memFS

	// mu guards the fields below.
	mu      sync.Mutex
	info    api.Sandbox
	procs   map[int]*process
	nextPid int
	execs   []api.ExecRequest
	resizes []api.TTY
	signals []string
}

// ID returns the sandbox's id.
func (sb *Sandbox) ID() string { sb.mu.Lock(); defer sb.mu.Unlock(); return sb.info.ID }

// Info returns the sandbox's description.
func (sb *Sandbox) Info() api.Sandbox { sb.mu.Lock(); defer sb.mu.Unlock(); return sb.info }

// Execs returns the exec requests received, in order.
func (sb *Sandbox) Execs() []api.ExecRequest {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return append([]api.ExecRequest(nil), sb.execs...)
}

// Resizes returns the terminal sizes received by resize requests.
func (sb *Sandbox) Resizes() []api.TTY {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return append([]api.TTY(nil), sb.resizes...)
}

// Signals returns the signals received by signal requests.
func (sb *Sandbox) Signals() []string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return append([]string(nil), sb.signals...)
}

// WriteFile creates or replaces a regular file (and its parents).
func (sb *Sandbox) WriteFile(path string, data []byte, mode uint32) error {
	return sb.fs.writeFile(path, bytes.NewReader(data), mode, true)
}

// ReadFile returns the content of a regular file.
func (sb *Sandbox) ReadFile(path string) ([]byte, error) { return sb.fs.readFile(path) }

// Mkdir creates a directory and its parents.
func (sb *Sandbox) Mkdir(path string) error { return sb.fs.mkdir(path, 0o755, true) }

// Proc is what an ExecFunc sees of the process it runs.
type Proc struct {
	Sandbox *Sandbox
	Req     api.ExecRequest
	Env     map[string]string // sandbox env merged with Req.Env
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer // the same as Stdout with a TTY
	Signals <-chan string
}

// ExecFunc runs one command and returns its exit code, or -1 and the name
// of the signal that killed it. It should return soon after ctx is done
// (the command's timeout expired or the sandbox was deleted).
type ExecFunc func(ctx context.Context, p *Proc) (code int, signal string)

type process struct {
	sb     *Sandbox
	pid    int
	stdinW *io.PipeWriter // nil unless StdinOpen
	sig    chan string
	cancel context.CancelFunc

	// mu guards the fields below; cond signals a change to them.
	mu     sync.Mutex
	cond   *sync.Cond
	info   api.Process
	events []api.ExecEvent
	done   bool
}

func (p *process) emit(ev api.ExecEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, ev)
	if ev.Type == api.EventExit || ev.Type == api.EventError {
		p.done = true
		p.info.Running = false
		p.info.ExitCode = ev.ExitCode
		now := time.Now().UTC()
		p.info.ExitedAt = &now
	}
	p.cond.Broadcast()
}

// stream writes events from index from until the final one or ctx is done.
func (p *process) stream(ctx context.Context, ew *eventWriter, from int) {
	stop := context.AfterFunc(ctx, func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() })
	defer stop()
	for i := from; ; i++ {
		p.mu.Lock()
		for i >= len(p.events) && !p.done && ctx.Err() == nil {
			p.cond.Wait()
		}
		if ctx.Err() != nil || i >= len(p.events) {
			p.mu.Unlock()
			return
		}
		ev := p.events[i]
		p.mu.Unlock()
		ew.send(ev)
		if ev.Type == api.EventExit || ev.Type == api.EventError {
			return
		}
	}
}

type outWriter struct {
	p   *process
	typ string
}

func (w outWriter) Write(b []byte) (int, error) {
	w.p.emit(api.ExecEvent{Type: w.typ, Data: bytes.Clone(b)})
	return len(b), nil
}

func (sb *Sandbox) killAll() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, p := range sb.procs {
		p.cancel()
	}
}

func (s *Server) execRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", s.withSandbox(s.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		sb.mu.Lock()
		list := api.ProcessList{Processes: []api.Process{}}
		for pid := 1; pid <= sb.nextPid; pid++ {
			if p := sb.procs[pid]; p != nil {
				p.mu.Lock()
				list.Processes = append(list.Processes, p.info)
				p.mu.Unlock()
			}
		}
		sb.mu.Unlock()
		writeJSON(w, http.StatusOK, list)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/attach", s.withProcess(func(w http.ResponseWriter, r *http.Request, p *process) {
		from := 0
		if r.URL.Query().Get("replay") != "true" {
			p.mu.Lock()
			for i, ev := range p.events { // skip buffered output, keep a final event
				if ev.Type == api.EventExit || ev.Type == api.EventError {
					break
				}
				from = i + 1
			}
			p.mu.Unlock()
		}
		p.stream(r.Context(), newEventWriter(w), from)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.withProcess(func(w http.ResponseWriter, r *http.Request, p *process) {
		if p.stdinW == nil {
			writeError(w, http.StatusConflict, "conflict", "process stdin is not open")
			return
		}
		if _, err := io.Copy(p.stdinW, r.Body); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			writeError(w, http.StatusBadRequest, "invalid_argument", "reading stdin: "+err.Error())
			return
		}
		if r.URL.Query().Get("close") == "true" {
			_ = p.stdinW.Close()
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", s.withProcess(func(w http.ResponseWriter, r *http.Request, p *process) {
		var req api.SignalRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Signal == "" {
			writeError(w, http.StatusBadRequest, "invalid_argument", "bad signal request")
			return
		}
		p.sb.mu.Lock()
		p.sb.signals = append(p.sb.signals, req.Signal)
		p.sb.mu.Unlock()
		select {
		case p.sig <- req.Signal:
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/resize", s.withProcess(func(w http.ResponseWriter, r *http.Request, p *process) {
		var req api.ResizeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", "bad resize request")
			return
		}
		p.sb.mu.Lock()
		p.sb.resizes = append(p.sb.resizes, req)
		p.sb.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
}

func (s *Server) withProcess(h func(http.ResponseWriter, *http.Request, *process)) http.HandlerFunc {
	return s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		pid, _ := strconv.Atoi(r.PathValue("pid"))
		sb.mu.Lock()
		p := sb.procs[pid]
		sb.mu.Unlock()
		if p == nil {
			writeError(w, http.StatusNotFound, "not_found", "process "+r.PathValue("pid")+" not found")
			return
		}
		h(w, r, p)
	})
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	var req api.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "decoding body: "+err.Error())
		return
	}
	if (len(req.Cmd) == 0) == (req.Command == "") {
		writeError(w, http.StatusBadRequest, "invalid_argument", "exactly one of cmd and command must be set")
		return
	}
	run := s.Exec
	if run == nil {
		run = Script
	}

	ctx, cancel := context.WithCancel(context.Background())
	if req.TimeoutSeconds > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(req.TimeoutSeconds*float64(time.Second)))
	}
	sb.mu.Lock()
	sb.nextPid++
	argv := req.Cmd
	if argv == nil {
		argv = []string{"/bin/sh", "-c", req.Command}
	}
	p := &process{sb: sb, pid: sb.nextPid, sig: make(chan string, 4), cancel: cancel,
		info: api.Process{Pid: sb.nextPid, Cmd: argv, TTY: req.TTY != nil, Running: true, StartedAt: time.Now().UTC()}}
	p.cond = sync.NewCond(&p.mu)
	sb.procs[p.pid] = p
	sb.execs = append(sb.execs, req)
	env := map[string]string{}
	for k, v := range sb.info.Env {
		env[k] = v
	}
	sb.mu.Unlock()
	for k, v := range req.Env {
		env[k] = v
	}

	proc := &Proc{Sandbox: sb, Req: req, Env: env, Signals: p.sig,
		Stdout: outWriter{p, api.EventStdout}, Stderr: outWriter{p, api.EventStderr}}
	if req.TTY != nil {
		proc.Stderr = proc.Stdout
	}
	if req.StdinOpen {
		pr, pw := io.Pipe()
		p.stdinW, proc.Stdin = pw, io.MultiReader(bytes.NewReader(req.Stdin), pr)
	} else {
		proc.Stdin = bytes.NewReader(req.Stdin)
	}
	p.emit(api.ExecEvent{Type: api.EventStarted, Pid: p.pid})
	go func() {
		defer cancel()
		code, sig := run(ctx, proc)
		ev := api.ExecEvent{Type: api.EventExit, ExitCode: &code, Signal: sig}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			minus := -1
			ev.ExitCode, ev.Signal, ev.TimedOut = &minus, "KILL", true
		}
		p.emit(ev)
	}()

	if req.Background {
		p.mu.Lock()
		info := p.info
		p.mu.Unlock()
		writeJSON(w, http.StatusCreated, info)
		return
	}
	p.stream(r.Context(), newEventWriter(w), 0)
}

// Script is the default ExecFunc: a tiny shell. A command string (or the
// script of ["sh", "-c", script]) is split on ";" and newlines into
// commands of whitespace-separated words ('single' and "double" quotes
// group words). Builtins:
//
//	echo WORDS      print WORDS to stdout     echoerr WORDS  the same to stderr
//	cat [FILE]      copy FILE or stdin to stdout
//	exit N          end with status N         true / false   status 0 / 1
//	sleep SECONDS   wait (ended by a signal: status -1, that signal)
//	pwd             print the working directory
//	printenv NAME   print a variable of the environment
//
// Any other command fails with status 127. An argv not run through a shell
// is one command.
func Script(ctx context.Context, p *Proc) (int, string) {
	var cmds [][]string
	argv := p.Req.Cmd
	script := p.Req.Command
	if len(argv) == 3 && argv[1] == "-c" && (strings.HasSuffix(argv[0], "sh")) {
		script = argv[2]
		argv = nil
	}
	if argv != nil {
		cmds = [][]string{argv}
	} else {
		for _, line := range strings.FieldsFunc(script, func(r rune) bool { return r == ';' || r == '\n' }) {
			if words := splitWords(line); len(words) > 0 {
				cmds = append(cmds, words)
			}
		}
	}
	status := 0
	for _, c := range cmds {
		var sig string
		status, sig = builtin(ctx, p, c)
		if sig != "" || c[0] == "exit" {
			return status, sig
		}
	}
	return status, ""
}

func builtin(ctx context.Context, p *Proc, c []string) (int, string) {
	name := c[0] // the path prefix of /bin/x is ignored
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	args := c[1:]
	switch name {
	case "echo":
		fmt.Fprintln(p.Stdout, strings.Join(args, " "))
	case "echoerr":
		fmt.Fprintln(p.Stderr, strings.Join(args, " "))
	case "cat":
		if len(args) > 0 {
			b, err := p.Sandbox.ReadFile(args[0])
			if err != nil {
				fmt.Fprintf(p.Stderr, "cat: %s: %v\n", args[0], err)
				return 1, ""
			}
			_, _ = p.Stdout.Write(b)
			return 0, ""
		}
		_, _ = io.Copy(p.Stdout, p.Stdin)
	case "exit":
		n := 0
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		return n, ""
	case "true":
	case "false":
		return 1, ""
	case "sleep":
		secs := 0.0
		if len(args) > 0 {
			secs, _ = strconv.ParseFloat(args[0], 64)
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
		case sig := <-p.Signals:
			return -1, sig
		case <-ctx.Done():
			return -1, "KILL"
		}
	case "pwd":
		cwd := p.Req.Cwd
		if cwd == "" {
			cwd = "/root"
		}
		fmt.Fprintln(p.Stdout, cwd)
	case "printenv":
		if len(args) > 0 {
			fmt.Fprintln(p.Stdout, p.Env[args[0]])
		}
	default:
		fmt.Fprintf(p.Stderr, "sh: %s: not found\n", c[0])
		return 127, ""
	}
	return 0, ""
}

// splitWords splits a command line on blanks, honouring quotes.
func splitWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
