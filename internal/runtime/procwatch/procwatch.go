// Package procwatch is what the backends whose sandbox is a host process
// (native: the guest; gvisor: the sentry) share of keeping track of it:
// who it is (its pid, and the start time that guards the pid against
// reuse: Open, StartTime), when it exits (a pidfd waited on in the Go
// netpoller: Watch), and what that makes of the sandbox (Status, and
// WaitExit, the bounded wait of a Destroy).
//
// It knows nothing of any backend: what a backend checks besides (its
// cgroup, runsc's view of the container) stays in the backend.
package procwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Process is a pidfd of a sandbox's process, held while the caller checks
// what else it must of the process before it adopts it (Watch). A Process
// is not safe for concurrent use.
type Process struct {
	pidfd int // -1 once closed or handed to Watch
}

// Open returns a Process (a non-blocking, pollable pidfd) of process pid,
// having checked that pid is still the process that started at startTime
// (see StartTime), as recorded in a sandbox's state. The pidfd is opened
// first: once it is held the pid cannot be reused behind the caller's
// back, so the start time and whatever the caller checks next are about
// this very process. It fails with errdefs.ErrNotFound when no process pid
// runs or another one does. The caller ends the Process with Watch or
// Close; a deferred Close after Watch does nothing.
func Open(pid int, startTime uint64) (*Process, error) {
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %v: %w", pid, err, errdefs.ErrNotFound)
	}
	if start, err := StartTime(pid); err != nil || start != startTime {
		unix.Close(pidfd)
		return nil, fmt.Errorf("pid %d is not the process it was (started at %d): %w", pid, startTime, errdefs.ErrNotFound)
	}
	return &Process{pidfd: pidfd}, nil
}

// Watch hands the pidfd to Watch: the returned channel is closed when the
// process exits. The Process is done with after, whatever Watch returns.
func (p *Process) Watch() (<-chan struct{}, error) {
	if p.pidfd < 0 {
		return nil, fmt.Errorf("pidfd already closed or watched: %w", errdefs.ErrInternal)
	}
	fd := p.pidfd
	p.pidfd = -1
	return Watch(fd)
}

// Close closes the pidfd unless Watch took it. Repeated calls do nothing.
func (p *Process) Close() {
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// Watch returns a channel closed when the process behind pidfd exits, and
// only then: a backend's Manager takes it for the sandbox's death and
// records the sandbox stopped. The pidfd is registered with the Go
// netpoller (it is non-blocking and pollable), so no thread blocks on it.
// Watch takes ownership of pidfd, also when it fails.
func Watch(pidfd int) (<-chan struct{}, error) {
	f := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("pidfd: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		if rc.Read(func(fd uintptr) bool { return exited(int(fd), 0) }) == nil {
			return
		}
		// The netpoller cannot wait on it (registration failed): block
		// this goroutine's thread in poll instead.
		_ = rc.Control(func(fd uintptr) {
			for !exited(int(fd), -1) {
				time.Sleep(100 * time.Millisecond)
			}
		})
	}()
	return done, nil
}

// poll is unix.Poll; tests make it fail.
var poll = unix.Poll

// exited polls pidfd with timeout (milliseconds; -1 blocks) and reports
// whether its process has exited (the pidfd is readable). poll fails with
// EINTR when a signal arrives meanwhile, even with a zero timeout (the Go
// runtime's preemption signal, SIGCHLD of the daemon's children); that is
// asked again, never taken for an exit, nor is any other failure to ask: a
// sandbox wrongly seen dead is recorded stopped, and reaped at the next
// start.
func exited(fd, timeout int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}
}

// Status is the runtime.Status of a sandbox whose process's exit closes
// done (Watch's channel, or the backend's own): running until then,
// stopped after.
func Status(done <-chan struct{}) runtime.Status {
	select {
	case <-done:
		return runtime.StatusStopped
	default:
		return runtime.StatusRunning
	}
}

// WaitExit waits for done to be closed, for at most timeout or until ctx
// ends; it fails with errdefs.ErrDeadlineExceeded when done is still open
// then. Destroy uses it after killing a sandbox's processes.
func WaitExit(ctx context.Context, done <-chan struct{}, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case <-done:
		return nil
	case <-wctx.Done():
		return fmt.Errorf("did not exit: %w", errdefs.ErrDeadlineExceeded)
	}
}
