package native

import (
	"fmt"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// A signal arriving while the watcher polls a re-adopted guest's pidfd
// (EINTR, even with a zero timeout) must not be taken for the guest's
// exit: the Manager would record a live sandbox stopped and reap it at the
// next start.
func TestWatchPidfdIgnoresEINTR(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()

	var interrupted atomic.Int32
	poll = func(fds []unix.PollFd, timeout int) (int, error) {
		if interrupted.Add(1) <= 3 {
			return -1, unix.EINTR
		}
		return unix.Poll(fds, timeout)
	}
	defer func() { poll = unix.Poll }()

	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	testutil.Requires(t, err == nil, fmt.Sprintf("pidfd_open (Linux 5.3+): %v", err))
	done, err := watchPidfd(pidfd)
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
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watcher missed the exit")
	}
}
