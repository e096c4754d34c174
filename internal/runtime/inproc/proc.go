package inproc

import (
	"bytes"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// marked returns the pids of the processes whose environment holds
// MarkerEnv=marker. Processes whose environment cannot be read (another
// user's, as an unprivileged test) are not the sandbox's.
func marked(marker string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(MarkerEnv + "=" + marker)
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(kv, want) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// signalMarked sends sig to every marked process.
func signalMarked(marker string, sig syscall.Signal) {
	for _, pid := range marked(marker) {
		_ = syscall.Kill(pid, sig)
	}
}

// stopMarked stops every marked process (SIGSTOP) and returns once each
// is stopped or gone, as a freezer returns once the cgroup is frozen; a
// process forked meanwhile is stopped in the next round. A process in an
// uninterruptible wait (D) counts as stopped: its SIGSTOP is pending, and
// a shell waiting in vfork for a child stopped before its exec stays in D
// until that child is continued.
func stopMarked(ctx context.Context, marker string) error {
	for {
		running := false
		for _, pid := range marked(marker) {
			switch procState(pid) {
			case "T", "t", "Z", "X", "D", "":
				continue
			}
			running = true
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// procState is the state letter of /proc/<pid>/stat ("R", "S", "T", ...),
// "" when the process is gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// killMarked SIGKILLs the marked processes until two scans in a row find
// none (a process may fork between a scan and its kill, and one caught in
// its execve may be missed by a scan), at most a few rounds.
func killMarked(marker string) {
	empty := 0
	for range 50 {
		pids := marked(marker)
		if len(pids) == 0 {
			if empty++; empty == 2 {
				return
			}
			continue
		}
		empty = 0
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond) // a killed process's environ reads empty once it has exited
	}
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCounters reads a process's CPU time (user + system) and resident
// memory.
func procCounters(pid int) (time.Duration, int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command (which may hold spaces) start after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, os.ErrInvalid
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime 15, rss 24.
	if len(f) < 22 {
		return 0, 0, os.ErrInvalid
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	cpu := time.Duration(utime+stime) * time.Second / clockTicks
	return cpu, rss * int64(os.Getpagesize()), nil
}

// holdListener is a listener whose Accept holds each connection while the
// sandbox is paused, until Resume or Close.
type holdListener struct {
	net.Listener

	// mu guards the fields below.
	mu      sync.Mutex
	held    bool
	resumed chan struct{} // closed on resume; replaced by hold
	closed  chan struct{}
	once    sync.Once
}

func newHoldListener(ln net.Listener) *holdListener {
	r := make(chan struct{})
	close(r)
	return &holdListener{Listener: ln, resumed: r, closed: make(chan struct{})}
}

func (l *holdListener) hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		l.held = true
		l.resumed = make(chan struct{})
	}
}

func (l *holdListener) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held {
		l.held = false
		close(l.resumed)
	}
}

func (l *holdListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	r := l.resumed
	l.mu.Unlock()
	select {
	case <-r:
		return c, nil
	case <-l.closed:
		c.Close()
		return nil, net.ErrClosed
	}
}

// Close closes the listener (idempotent) and drops held connections.
func (l *holdListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		err = l.Listener.Close()
	})
	return err
}

// Processes returns the pids of sandbox id's processes (those started by
// a guest of this process, marked with MarkerEnv), for tests that check
// nothing is left behind.
func Processes(id string) []int { return marked(strconv.Itoa(os.Getpid()) + ":" + id) }
