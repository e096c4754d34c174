package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

var (
	//go:embed drivers/python.py
	pythonDriver string
	//go:embed drivers/node.js
	nodeDriver string
	//go:embed drivers/bash.sh
	bashDriver string
)

// Launcher returns the command that runs a language's driver, given the
// driver's source; tests replace it to run a fake driver.
type Launcher func(language string) (*exec.Cmd, error)

// Language normalises a language name ("" is Python; "js" and "node" are
// JavaScript; "sh" is bash), failing with errdefs.ErrInvalidArgument for
// one the server does not know.
func Language(s string) (string, error) {
	if l, ok := api.CodeLanguage(s); ok {
		return l, nil
	}
	return "", fmt.Errorf("language %q not supported (python, javascript, bash): %w", s, errdefs.ErrInvalidArgument)
}

// DefaultLauncher runs the embedded drivers with python3, node and bash
// from PATH; a missing interpreter fails with errdefs.ErrFailedPrecondition.
func DefaultLauncher(language string) (*exec.Cmd, error) {
	var bin string
	var args []string
	switch language {
	case api.LanguagePython:
		bin, args = "python3", []string{"-c", pythonDriver}
	case api.LanguageJavaScript:
		bin, args = "node", []string{"-e", nodeDriver}
	case api.LanguageBash:
		bin, args = "bash", []string{"--noprofile", "--norc", "-c", bashDriver}
	default:
		return nil, fmt.Errorf("language %q: %w", language, errdefs.ErrInvalidArgument)
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s contexts need %s installed in the sandbox (try the code-interpreter template): %w", language, bin, errdefs.ErrFailedPrecondition)
	}
	return exec.Command(path, args...), nil
}

// interruptGrace is how long a cell has to stop after SIGINT before its
// context is killed and restarted.
const interruptGrace = 5 * time.Second

// markerWait bounds the wait for the markers after a driver said "done":
// a cell may have closed its stdout, or left a child holding it.
const markerWait = 2 * time.Second

// maxControlLine bounds one event line of a driver (a large PNG fits).
const maxControlLine = 64 << 20

// kernel is one context's interpreter process. Cells run one at a time
// (mu); the process is started on first use and again after it died.
type kernel struct {
	ctx    api.CodeContext
	launch Launcher
	env    []string

	// mu serialises cells and guards the fields below.
	mu      sync.Mutex
	proc    *process
	count   int
	scratch string // bash: directory of cell files
}

// process is one run of a driver.
type process struct {
	cmd    *exec.Cmd
	ctlW   *os.File
	events chan driverEvent // control events, closed when fd 4 ends
	output chan outChunk    // stdout/stderr pieces, closed when both end
	exited chan struct{}    // closed when the process was reaped
	marker string
}

type driverEvent struct {
	api.CodeEvent
	Count  int    `json:"count"`
	Marked []bool `json:"marked"`
	Pid    int    `json:"pid"`
}

type outChunk struct {
	stream string // api.CodeEventStdout or api.CodeEventStderr
	data   []byte
	mark   bool
}

func newMarker() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "\x1eagentbox-cell-end-" + hex.EncodeToString(b) + "\x1e"
}

// start runs the driver; the caller holds k.mu.
func (k *kernel) startLocked() (*process, error) {
	cmd, err := k.launch(k.ctx.Language)
	if err != nil {
		return nil, err
	}
	marker := newMarker()
	cmd.Dir = k.ctx.Cwd
	cmd.Env = append(append([]string{}, k.env...), "AGENTBOX_CODE_MARKER="+marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, errors.Join(err, reqR.Close(), reqW.Close(), evR.Close(), evW.Close())
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, errors.Join(err, reqR.Close(), reqW.Close(), evR.Close(), evW.Close())
	}
	cmd.ExtraFiles = []*os.File{reqR, evW} // fds 3 and 4
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("starting the %s driver: %w", k.ctx.Language, err), reqR.Close(), reqW.Close(), evR.Close(), evW.Close())
	}
	reqR.Close()
	evW.Close()
	p := &process{cmd: cmd, ctlW: reqW, events: make(chan driverEvent, 16), output: make(chan outChunk, 64), exited: make(chan struct{}), marker: marker}
	go func() {
		defer close(p.events)
		defer evR.Close()
		sc := bufio.NewScanner(evR)
		sc.Buffer(make([]byte, 64<<10), maxControlLine)
		for sc.Scan() {
			var ev driverEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				p.events <- ev
			}
		}
	}()
	var pumps sync.WaitGroup
	for _, s := range []struct {
		name string
		r    interface{ Read([]byte) (int, error) }
	}{{api.CodeEventStdout, stdout}, {api.CodeEventStderr, stderr}} {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			sp := &splitter{marker: []byte(marker)}
			buf := make([]byte, 32<<10)
			for {
				n, err := s.r.Read(buf)
				for _, pc := range sp.feed(buf[:n]) {
					p.output <- outChunk{stream: s.name, data: pc.data, mark: pc.mark}
				}
				if err != nil {
					if rest := sp.flush(); len(rest) > 0 {
						p.output <- outChunk{stream: s.name, data: rest}
					}
					return
				}
			}
		}()
	}
	go func() {
		pumps.Wait()
		close(p.output)
		_ = cmd.Wait()
		close(p.exited)
	}()
	// Wait for the driver's "ready".
	select {
	case ev, ok := <-p.events:
		if ok && ev.Type == "ready" {
			return p, nil
		}
	case <-time.After(30 * time.Second):
	}
	p.kill()
	return nil, fmt.Errorf("the %s driver did not start: %w", k.ctx.Language, errdefs.ErrUnavailable)
}

// kill ends the driver and everything in its process group, and drains
// what it wrote that nobody will read (the pumps must finish for the
// process to be reaped and exited closed).
func (p *process) kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = p.ctlW.Close()
	go func() {
		for range p.output {
		}
	}()
	go func() {
		for range p.events {
		}
	}()
}

// interrupt sends SIGINT to the driver's process group.
func (p *process) interrupt() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	}
}

// stop kills the driver, if it runs; the caller holds k.mu.
func (k *kernel) stopLocked() {
	if k.proc != nil {
		k.proc.kill()
		<-k.proc.exited
		k.proc = nil
	}
}

// close ends the context for good.
func (k *kernel) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked()
	if k.scratch != "" {
		_ = os.RemoveAll(k.scratch)
	}
}

// restart starts the context afresh: its state is lost.
func (k *kernel) restart() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked()
	p, err := k.startLocked()
	if err != nil {
		return err
	}
	k.proc = p
	return nil
}

// request is what the server sends the driver for one cell.
func (k *kernel) requestLocked(code string, env map[string]string) ([]byte, error) {
	if k.ctx.Language != api.LanguageBash {
		b, err := json.Marshal(struct {
			Code string            `json:"code"`
			Env  map[string]string `json:"env,omitempty"`
		}{code, env})
		return append(b, '\n'), err
	}
	// bash reads a line: the path of a file holding the cell.
	if k.scratch == "" {
		dir, err := os.MkdirTemp("", "agentbox-code-")
		if err != nil {
			return nil, err
		}
		k.scratch = dir
	}
	var sb strings.Builder
	keys := make([]string, 0, len(env))
	for key := range env {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if !envName(key) {
			return nil, fmt.Errorf("env name %q: %w", key, errdefs.ErrInvalidArgument)
		}
		fmt.Fprintf(&sb, "export %s=%s\n", key, shellQuote(env[key]))
	}
	sb.WriteString(code)
	sb.WriteString("\n")
	path := filepath.Join(k.scratch, fmt.Sprintf("cell-%d.sh", k.count+1))
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		return nil, err
	}
	return []byte(path + "\n"), nil
}

func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// execute runs one cell, calling emit for each event in order, the last
// being end_of_execution. It returns an error (and emits nothing more)
// only when the cell could not be run; an emit error (the client went
// away) stops emitting, not the cell: a context runs its cells to the end,
// as a notebook kernel does. timeout > 0 interrupts the cell after that
// long.
func (k *kernel) execute(ctx context.Context, code string, env map[string]string, timeout time.Duration, emit func(api.CodeEvent) error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc != nil {
		select {
		case <-k.proc.exited:
			k.proc = nil // died since: start again
		default:
		}
	}
	if k.proc == nil {
		p, err := k.startLocked()
		if err != nil {
			return err
		}
		k.proc = p
	}
	p := k.proc
	req, err := k.requestLocked(code, env)
	if err != nil {
		return err
	}
	if _, err := p.ctlW.Write(req); err != nil {
		k.stopLocked()
		return fmt.Errorf("sending the cell to the %s driver: %w", k.ctx.Language, errdefs.ErrUnavailable)
	}
	k.count++

	gone := false
	send := func(ev api.CodeEvent) {
		if !gone && emit(ev) != nil {
			gone = true
		}
	}
	var timer, killTimer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var (
		done        bool
		timedOut    bool
		awaitMark   = map[string]bool{}
		markTimeout <-chan time.Time
		events      = p.events
		output      = p.output
	)
	// Results and errors are held until the cell's output has all
	// arrived: they come on another pipe, and the output written before
	// them belongs before them.
	var held []api.CodeEvent
	finish := func() {
		for _, ev := range held {
			send(ev)
		}
		held = nil
		send(api.CodeEvent{Type: api.CodeEventNumberOfExecutions, ExecutionCount: k.count})
		send(api.CodeEvent{Type: api.CodeEventEndOfExecution})
	}
	for {
		if done && len(awaitMark) == 0 {
			finish()
			return nil
		}
		select {
		case c, ok := <-output:
			if !ok {
				output = nil
				awaitMark = map[string]bool{}
				continue
			}
			if c.mark {
				delete(awaitMark, c.stream)
				continue
			}
			send(api.CodeEvent{Type: c.stream, Text: string(c.data)})
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			switch ev.Type {
			case "done":
				done = true
				for i, s := range []string{api.CodeEventStdout, api.CodeEventStderr} {
					if i < len(ev.Marked) && ev.Marked[i] && output != nil {
						awaitMark[s] = true
					}
				}
				markTimeout = time.After(markerWait)
			case api.CodeEventResult:
				ev.CodeEvent.Type = api.CodeEventResult
				if len(ev.JSON) > 0 {
					var b bytes.Buffer
					if json.Compact(&b, ev.JSON) == nil {
						ev.JSON = b.Bytes()
					}
				}
				held = append(held, ev.CodeEvent)
			case api.CodeEventError:
				if timedOut {
					v := fmt.Sprintf("execution timed out after %s (interrupted: %s)", timeout, ev.Name)
					if ev.Value != "" {
						v = fmt.Sprintf("execution timed out after %s (interrupted: %s: %s)", timeout, ev.Name, ev.Value)
					}
					ev.Name, ev.Value = "TimeoutError", v
				}
				held = append(held, api.CodeEvent{Type: api.CodeEventError, Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback})
			}
		case <-markTimeout:
			awaitMark = map[string]bool{}
		case <-timer:
			timedOut = true
			timer = nil
			p.interrupt()
			killTimer = time.After(interruptGrace)
		case <-killTimer:
			k.stopLocked()
			held = append(held, api.CodeEvent{Type: api.CodeEventError, Name: "TimeoutError", Value: fmt.Sprintf("execution timed out after %s and did not stop on an interrupt: the context was restarted, its state is lost", timeout)})
			finish()
			return nil
		case <-p.exited:
			// Pass on what the driver wrote before it died (output is
			// closed by now; events may be held open by a child).
			for output != nil {
				c, ok := <-output
				if !ok {
					break
				}
				if !c.mark {
					send(api.CodeEvent{Type: c.stream, Text: string(c.data)})
				}
			}
			drain := time.After(markerWait)
		events:
			for events != nil {
				select {
				case ev, ok := <-events:
					if !ok {
						break events
					}
					if ev.Type == api.CodeEventResult || ev.Type == api.CodeEventError {
						ev.CodeEvent.Type = ev.Type
						held = append(held, ev.CodeEvent)
					}
				case <-drain:
					break events
				}
			}
			code := p.cmd.ProcessState.ExitCode()
			k.proc = nil
			if !done {
				held = append(held, api.CodeEvent{Type: api.CodeEventError, Name: "ContextExited", Value: fmt.Sprintf("the %s process exited (status %d); the context starts afresh on its next cell", k.ctx.Language, code)})
			}
			finish()
			return nil
		case <-ctx.Done():
			// The client went away: the cell runs on, its output dropped.
			gone = true
			ctx = context.Background()
		}
	}
}
