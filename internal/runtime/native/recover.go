package native

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

// state is what Sandbox.State returns and Recover reads back.
type state struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // field 22 of /proc/<pid>/stat, guards against pid reuse
	Cgroup    string `json:"cgroup"`
}

// Recover re-adopts a sandbox from its State. The guest must still run as
// the same process (pid and start time) and be in the sandbox's cgroup,
// under the backend's parent or, for a sandbox of an earlier version,
// LegacyCgroupParent; otherwise it fails with errdefs.ErrNotFound. The adopted guest is not our
// child, so its exit is watched through a pidfd.
func (b *Backend) Recover(ctx context.Context, spec runtime.Spec, raw []byte) (runtime.Sandbox, error) {
	if !idPattern.MatchString(spec.ID) {
		return nil, fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil || st.Pid <= 1 {
		return nil, fmt.Errorf("recovering sandbox %s: unusable state: %w", spec.ID, errdefs.ErrNotFound)
	}
	switch st.Cgroup {
	case b.cgroupPath(spec.ID):
	case legacyCgroupPath(spec.ID):
		// Made by a daemon of a version that put every sandbox under
		// the shared parent: adopted there, and cleaned up there too
		// (Cleanup) should it not be adoptable.
		b.legacy.Store(spec.ID, true)
	default:
		return nil, fmt.Errorf("recovering sandbox %s: state names cgroup %q: %w", spec.ID, st.Cgroup, errdefs.ErrNotFound)
	}
	// Open the pidfd first: once we hold it, the pid cannot be reused
	// behind our back, so the checks below are about this very process.
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
	start, err := procStartTime(st.Pid)
	if err != nil || start != st.StartTime {
		return nil, fmt.Errorf("recovering sandbox %s: pid %d is not the guest: %w", spec.ID, st.Pid, errdefs.ErrNotFound)
	}
	cg, err := loadCgroup(b.mode, st.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	if in, err := cg.contains(st.Pid); err != nil || !in {
		return nil, fmt.Errorf("recovering sandbox %s: pid %d is not in cgroup %s: %w", spec.ID, st.Pid, st.Cgroup, errdefs.ErrNotFound)
	}

	done, err := watchPidfd(pidfd)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	ok = true
	b.log.InfoContext(ctx, "sandbox recovered", "sandbox", spec.ID, "pid", st.Pid)
	return newSandbox(b, spec, cg, st, done), nil
}

// watchPidfd returns a channel closed when the process behind pidfd exits,
// and only then: the Manager takes it for the guest's death and records the
// sandbox stopped. The pidfd is registered with the Go netpoller (it is
// non-blocking and pollable), so no thread blocks on it. It takes ownership
// of pidfd.
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
		err := rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd), 0) })
		if err == nil {
			return
		}
		// The netpoller cannot wait on it (registration failed): block
		// this goroutine's thread in poll instead.
		_ = rc.Control(func(fd uintptr) {
			for !pidfdExited(int(fd), -1) {
				time.Sleep(100 * time.Millisecond)
			}
		})
	}()
	return done, nil
}

// poll is unix.Poll; tests make it fail.
var poll = unix.Poll

// pidfdExited polls pidfd with timeout (milliseconds; -1 blocks) and
// reports whether its process has exited (the pidfd is readable). poll
// fails with EINTR when a signal arrives meanwhile, even with a zero
// timeout (the Go runtime's preemption signal, SIGCHLD of the daemon's
// children); that is asked again, never taken for an exit, nor is any
// other failure to ask: a guest wrongly seen dead is recorded stopped, and
// reaped at the next start.
func pidfdExited(fd, timeout int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	}
}

// procStartTime returns field 22 (starttime, in clock ticks since boot) of
// /proc/<pid>/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// comm (field 2) may contain spaces and parentheses: split after the
	// last ')'. The remaining fields start at field 3.
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
