package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Recover re-adopts a sandbox from its State: the sandbox process must
// still run as the same process (pid and start time) and runsc must know
// the container with that pid, running or paused; otherwise it fails with
// errdefs.ErrNotFound. The process is not our child: its exit is watched
// through a pidfd.
func (b *Backend) Recover(ctx context.Context, spec runtime.Spec, raw []byte) (runtime.Sandbox, error) {
	if !idPattern.MatchString(spec.ID) {
		return nil, fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	st, err := parseState(raw, spec.ID)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	// Open the pidfd first: once held, the pid cannot be reused behind
	// our back, so the checks below are about this very process.
	pidfd, err := unix.PidfdOpen(st.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: pid %d: %v: %w", spec.ID, st.Pid, err, errdefs.ErrNotFound)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(pidfd)
		}
	}()
	if start, err := procStartTime(st.Pid); err != nil || start != st.StartTime {
		return nil, fmt.Errorf("recovering sandbox %s: pid %d is not its sandbox process: %w", spec.ID, st.Pid, errdefs.ErrNotFound)
	}
	rs, err := b.containerState(ctx, spec.ID)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %v: %w", spec.ID, err, errdefs.ErrNotFound)
	}
	if rs.Pid != st.Pid || (rs.Status != "running" && rs.Status != "paused") {
		return nil, fmt.Errorf("recovering sandbox %s: runsc reports pid %d %q: %w", spec.ID, rs.Pid, rs.Status, errdefs.ErrNotFound)
	}
	done, err := watchPidfd(pidfd)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	ok = true
	b.log.InfoContext(ctx, "sandbox recovered", "sandbox", spec.ID, "pid", st.Pid)
	return b.newSandbox(spec, st, done), nil
}

// parseState reads the State of sandbox id: errdefs.ErrNotFound unless it
// is JSON naming a sandbox process (pid > 1) and the container id.
func parseState(raw []byte, id string) (state, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil || st.Pid <= 1 {
		return state{}, fmt.Errorf("unusable state: %w", errdefs.ErrNotFound)
	}
	if st.ContainerID != id {
		return state{}, fmt.Errorf("state names container %q: %w", st.ContainerID, errdefs.ErrNotFound)
	}
	return st, nil
}

// Cleanup removes whatever is left of a sandbox from its spec alone: the
// runsc container, every process left in its cgroup and the cgroup, the
// bundle and its mounts, the socket and the state dir. Idempotent.
func (b *Backend) Cleanup(ctx context.Context, spec runtime.Spec) error {
	if !idPattern.MatchString(spec.ID) {
		return fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	var errs []error
	if err := b.deleteContainer(ctx, spec.ID); err != nil {
		errs = append(errs, err)
	}
	if err := b.removeRest(ctx, spec); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up sandbox %s: %w", spec.ID, err)
	}
	b.log.InfoContext(ctx, "sandbox cleaned up", "sandbox", spec.ID)
	return nil
}

// watchPidfd returns a channel closed when the process behind pidfd exits.
// It takes ownership of pidfd; the pidfd is waited on in the netpoller.
func watchPidfd(pidfd int) (<-chan struct{}, error) {
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
		if rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd), 0) }) == nil {
			return
		}
		// Not pollable in the netpoller: poll on this goroutine's thread.
		_ = rc.Control(func(fd uintptr) {
			for !pidfdExited(int(fd), -1) {
				time.Sleep(100 * time.Millisecond)
			}
		})
	}()
	return done, nil
}

// pidfdExited reports whether pidfd's process has exited, polling with
// timeout (ms; -1 blocks); EINTR is asked again, never taken for an exit.
func pidfdExited(fd, timeout int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}
}

// procStartTime returns field 22 (starttime) of /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	const idx = 22 - 3
	if len(fields) <= idx {
		return 0, errors.New("short /proc stat")
	}
	return strconv.ParseUint(fields[idx], 10, 64)
}
