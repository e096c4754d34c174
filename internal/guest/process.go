package guest

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// How long a finished process's output is still awaited after it exited
// (see finish): a background child ("cmd &") may hold the output pipe open
// forever, and the exit must not wait for it. Output arriving later still
// lands in the replay buffer.
const (
	drainGrace = 10 * time.Millisecond // pipes empty and pumps idle this long: done
	drainMax   = 10 * time.Second      // never wait longer for output after exit
)

// chunk is one piece of output; data is never modified after creation.
type chunk struct {
	stream proto.FrameType // FrameStdout or FrameStderr
	data   []byte
}

// outputRing keeps the newest max bytes of a process's output.
type outputRing struct {
	chunks []chunk
	size   int
	max    int
}

func (r *outputRing) add(c chunk) {
	r.chunks = append(r.chunks, c)
	r.size += len(c.data)
	for r.size > r.max && len(r.chunks) > 0 {
		over := r.size - r.max
		first := &r.chunks[0]
		if len(first.data) <= over {
			r.size -= len(first.data)
			r.chunks[0] = chunk{}
			r.chunks = r.chunks[1:]
			continue
		}
		first.data = first.data[over:]
		r.size -= over
	}
}

func (r *outputRing) snapshot() []chunk {
	return append([]chunk(nil), r.chunks...)
}

// subscriber receives a process's live output. The pumps block on ch (back
// pressure on the process) until the subscriber reads or is gone.
type subscriber struct {
	ch   chan chunk
	gone chan struct{}
	once sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{ch: make(chan chunk, 64), gone: make(chan struct{})}
}

// process is one process started through exec.
type process struct {
	pid       int
	cmd       []string
	tty       bool
	private   bool // started with ExecRequest.Private (secrets, a run token)
	startedAt time.Time
	timedOut  atomic.Bool
	timer     *time.Timer
	// cgroup is the name of the exec's cgroup in cgs ("": none).
	cgroup string
	cgs    *execCgroups

	stdin       *os.File    // pipe write end or PTY master
	stdinMu     sync.Mutex  // serialises writes to stdin
	stdinClosed atomic.Bool // set once stdin is closed
	pty         *os.File    // PTY master, for resize; owned by the pump

	reaped chan struct{} // closed when result is set
	pumps  sync.WaitGroup
	// outputs are the read ends the pumps read; busy counts pumps holding
	// data they have read but not yet delivered. finish uses both to know
	// when everything the process wrote has been delivered.
	outputs []*os.File
	busy    atomic.Int32
	done    chan struct{} // closed when finished: output drained, result final

	// mu guards the fields below.
	mu       sync.Mutex
	ring     outputRing
	subs     map[*subscriber]struct{}
	result   *proto.Exit // set by the reaper
	exitedAt time.Time
}

func (p *process) onExit(ws syscall.WaitStatus) {
	ex := &proto.Exit{TimedOut: p.timedOut.Load()}
	switch {
	case ws.Signaled():
		ex.ExitCode = -1
		ex.Signal = signalName(ws.Signal())
	default:
		ex.ExitCode = ws.ExitStatus()
	}
	p.mu.Lock()
	p.result = ex
	p.exitedAt = time.Now()
	p.mu.Unlock()
	close(p.reaped)
}

// pump copies one output stream into the ring and to the subscribers until
// EOF, then closes it.
func (p *process) pump(f *os.File, stream proto.FrameType) {
	defer p.pumps.Done()
	defer f.Close()
	bp := pumpBufs.Get().(*[]byte)
	defer pumpBufs.Put(bp)
	buf := *bp
	var subs []*subscriber
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.busy.Add(1)
			c := chunk{stream: stream, data: bytes.Clone(buf[:n])}
			p.mu.Lock()
			p.ring.add(c)
			subs = subs[:0]
			for s := range p.subs {
				subs = append(subs, s)
			}
			p.mu.Unlock()
			for _, s := range subs {
				select {
				case s.ch <- c:
				case <-s.gone:
				}
			}
			p.busy.Add(-1)
		}
		if err != nil {
			return // EOF, or EIO from a PTY master whose slave is gone
		}
	}
}

// pending reports whether output is unread in a pipe or read but not yet
// delivered by a pump.
func (p *process) pending() bool {
	if p.busy.Load() > 0 {
		return true
	}
	for _, f := range p.outputs {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		_ = rc.Control(func(fd uintptr) {
			n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
		})
		if n > 0 {
			return true
		}
	}
	return false
}

var pumpBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// finish waits for the exit status and the output, then marks p done.
//
// Once the process is reaped, everything it wrote is in its pipes. The
// pumps normally reach EOF at once; but a background child that inherited
// the pipes keeps them open, so finish also stops waiting once the pipes
// hold no unread byte and no pump is delivering one (after a short grace),
// or after drainMax in any case. A loaded machine that is slow to schedule
// the pumps therefore delays the exit event; it never loses output.
func (p *process) finish(t *table, cgs *execCgroups) {
	<-p.reaped
	if p.timer != nil {
		p.timer.Stop()
	}
	drained := make(chan struct{})
	go func() { p.pumps.Wait(); close(drained) }()
	deadline := time.After(drainMax)
	idleSince := time.Time{}
wait:
	for {
		select {
		case <-drained:
			break wait
		case <-deadline:
			break wait
		case <-time.After(time.Millisecond):
		}
		if p.pending() {
			idleSince = time.Time{}
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		} else if time.Since(idleSince) >= drainGrace {
			break wait
		}
	}
	p.closeStdin(false)
	close(p.done)
	t.retire(p)
	cgs.release(p.cgroup)
}

// subscribe returns the buffered output (when replay) and, while p has not
// finished, a live subscription. Call unsubscribe when done.
func (p *process) subscribe(replay bool) ([]chunk, *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var buffered []chunk
	if replay {
		buffered = p.ring.snapshot()
	}
	select {
	case <-p.done:
		return buffered, nil
	default:
	}
	s := newSubscriber()
	p.subs[s] = struct{}{}
	return buffered, s
}

func (p *process) unsubscribe(s *subscriber) {
	if s == nil {
		return
	}
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	s.once.Do(func() { close(s.gone) })
}

func (p *process) exitInfo() proto.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *p.result
}

// writeStdin writes b to the process's stdin.
func (p *process) writeStdin(b []byte) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinClosed.Load() {
		return fmt.Errorf("stdin of process %d is closed: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	if _, err := p.stdin.Write(b); err != nil {
		return fmt.Errorf("writing stdin of process %d: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// closeStdin closes stdin. With a PTY the master also carries the output,
// so "closing" sends an end-of-file character instead (when eof is set).
// It does not wait for a blocked writeStdin: closing the pipe unblocks it.
func (p *process) closeStdin(eof bool) {
	if p.tty {
		if eof && !p.stdinClosed.Load() {
			p.stdinMu.Lock()
			_, _ = p.stdin.Write([]byte{4}) // ^D
			p.stdinMu.Unlock()
		}
		if !eof {
			p.stdinClosed.Store(true) // the pump closes the master
		}
		return
	}
	if p.stdinClosed.Swap(true) {
		return
	}
	_ = p.stdin.Close()
}

// signal sends sig to the process group of p. SIGKILL (a timeout, an
// explicit kill, the guest's shutdown) goes further: it kills the exec's
// cgroup, every process the exec started wherever it went (see
// execCgroups), and then the process group.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.result != nil {
		return fmt.Errorf("process %d has exited: %w", p.pid, errdefs.ErrConflict)
	}
	cgroupKilled := false
	if sig == syscall.SIGKILL && p.cgroup != "" {
		if err := p.cgs.kill(p.cgroup); err != nil {
			return fmt.Errorf("signalling process %d: %w", p.pid, err)
		}
		cgroupKilled = true
	}
	err := unix.Kill(-p.pid, sig)
	if err == unix.ESRCH {
		err = unix.Kill(p.pid, sig)
	}
	// The cgroup's kill already reached the process: the reaper may have
	// collected it before the group kill ran.
	if err == unix.ESRCH && cgroupKilled {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("signalling process %d: %w", p.pid, err)
	}
	return nil
}

func (p *process) resize(tty api.TTY) error {
	if !p.tty {
		return fmt.Errorf("process %d has no TTY: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	if err := setWinsize(p.pty, tty); err != nil {
		return fmt.Errorf("resizing TTY of process %d: %w", p.pid, err)
	}
	return nil
}

func (p *process) info() api.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := api.Process{Pid: p.pid, Cmd: p.cmd, TTY: p.tty, Private: p.private, Running: p.result == nil, StartedAt: p.startedAt}
	if p.result != nil {
		code := p.result.ExitCode
		at := p.exitedAt
		out.ExitCode, out.ExitedAt = &code, &at
		out.Signal, out.TimedOut = p.result.Signal, p.result.TimedOut
	}
	return out
}

// setWinsize sets the window size of a PTY master.
func setWinsize(f *os.File, tty api.TTY) error {
	if tty.Rows == 0 || tty.Cols == 0 {
		return fmt.Errorf("terminal size %dx%d: %w", tty.Rows, tty.Cols, errdefs.ErrInvalidArgument)
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = sc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: tty.Rows, Col: tty.Cols})
	})
	if err != nil {
		return err
	}
	return ioErr
}

// table holds the processes, running and recently exited.
type table struct {
	maxExited int
	// privateExecs counts the private execs asked of this guest since it
	// started (its memory may hold what they were given: the guest's
	// buffers are not scrubbed). Never decremented.
	privateExecs atomic.Int64

	// mu guards the fields below.
	mu     sync.Mutex
	procs  map[int]*process
	exited []*process // finished processes, oldest first
}

func newTable(maxExited int) *table {
	return &table{maxExited: maxExited, procs: make(map[int]*process)}
}

func (t *table) add(p *process) {
	t.mu.Lock()
	t.procs[p.pid] = p // replaces an exited record of a reused pid
	t.mu.Unlock()
}

func (t *table) get(pid int) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[pid]
	if !ok {
		return nil, fmt.Errorf("process %d: %w", pid, errdefs.ErrNotFound)
	}
	return p, nil
}

// retire records p as finished and drops the oldest finished records
// beyond maxExited.
func (t *table) retire(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.exited = append(t.exited, p)
	for len(t.exited) > t.maxExited {
		old := t.exited[0]
		t.exited[0] = nil
		t.exited = t.exited[1:]
		if t.procs[old.pid] == old {
			delete(t.procs, old.pid)
		}
	}
}

func (t *table) list() []api.Process {
	t.mu.Lock()
	ps := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	out := make([]api.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out
}
