package procwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

func requiresPidfd(t *testing.T) {
	t.Helper()
	fd, err := unix.PidfdOpen(os.Getpid(), unix.PIDFD_NONBLOCK)
	testutil.Requires(t, err == nil, fmt.Sprintf("pidfd_open (Linux 5.3+): %v", err))
	unix.Close(fd)
}

// A signal arriving while the watcher polls a re-adopted process's pidfd
// (EINTR, even with a zero timeout) must not be taken for its exit: the
// Manager would record a live sandbox stopped and reap it at the next
// start.
func TestWatchIgnoresEINTR(t *testing.T) {
	requiresPidfd(t)
	proc, _ := testutil.Sleeper(t)
	var interrupted atomic.Int32
	poll = func(fds []unix.PollFd, timeout int) (int, error) {
		if interrupted.Add(1) <= 3 {
			return -1, unix.EINTR
		}
		return unix.Poll(fds, timeout)
	}
	// The watcher reads poll until the process exits, which the test
	// waits for below.
	defer func() { poll = unix.Poll }()

	pidfd, err := unix.PidfdOpen(proc.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	done, err := Watch(pidfd)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatalf("watcher reported the exit of a running process (poll interrupted %d times)", interrupted.Load())
	case <-time.After(200 * time.Millisecond):
	}
	if interrupted.Load() < 3 {
		t.Fatalf("poll was called %d times, want at least 3", interrupted.Load())
	}
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watcher missed the exit")
	}
}

// Open adopts the process its state names and nothing else: a start time
// that is not the process's (the pid reused by another process) and a pid
// that runs nothing are ErrNotFound. A Process is watched once, and its
// Close after Watch leaves the watched pidfd alone.
func TestOpen(t *testing.T) {
	requiresPidfd(t)
	proc, _ := testutil.Sleeper(t)
	pid := proc.Pid
	start, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(pid, start+1); !errdefs.IsNotFound(err) {
		t.Errorf("Open with another start time = %v, want ErrNotFound", err)
	}
	if _, err := Open(1<<22+1, start); !errdefs.IsNotFound(err) {
		t.Errorf("Open of a pid that runs nothing = %v, want ErrNotFound", err)
	}
	p, err := Open(pid, start)
	if err != nil {
		t.Fatalf("Open of the process itself: %v", err)
	}
	done, err := p.Watch()
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := p.Watch(); err == nil {
		t.Error("a second Watch succeeded")
	}
	if got := Status(done); got != runtime.StatusRunning {
		t.Errorf("Status of a running process = %s", got)
	}
	if err := WaitExit(t.Context(), done, 50*time.Millisecond); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("WaitExit of a running process = %v, want ErrDeadlineExceeded", err)
	}
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := WaitExit(t.Context(), done, 10*time.Second); err != nil {
		t.Fatalf("WaitExit after the kill: %v (the watched pidfd was closed under the watcher?)", err)
	}
	if got := Status(done); got != runtime.StatusStopped {
		t.Errorf("Status of an exited process = %s", got)
	}
	// A cancelled ctx ends the wait as the timeout does.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := WaitExit(ctx, make(chan struct{}), time.Hour); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("WaitExit with a cancelled ctx = %v, want ErrDeadlineExceeded", err)
	}
}
