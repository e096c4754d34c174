package guest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// execCgroups gives every exec a cgroup v2 cgroup of its own, a child of
// the delegated cgroup the guest was born in (see package native,
// execcgroup.go, for the host's part). The exec's process is started
// directly inside it (clone3 CLONE_INTO_CGROUP: no migration, no extra
// process), and everything it starts inherits it and cannot leave it
// (sandbox processes have no cgroup filesystem). Killing the exec kills
// the cgroup (cgroup.kill): every descendant, including those that started
// a session of their own, double-forked to PID 1 or changed process group.
//
// A session or process-group based kill, with or without
// PR_SET_CHILD_SUBREAPER, cannot do that: the guest is PID 1, so a process
// that double-forks is reparented to it and, in a new session, shares
// nothing with the exec it came from. A per-exec PID namespace would also
// hold them, but changes what the processes see (pids, PID 1 signal
// semantics) and costs a process per exec; a cgroup costs a mkdir and an
// rmdir.
//
// An exec that exits normally leaves its background processes running (as
// "cmd &" always did); its cgroup is removed once they are gone (sweep).
//
// Without a delegated cgroup (a legacy cgroup v1 host) root is nil, every
// method is a no-op and a timeout reaches the exec's process group only.
type execCgroups struct {
	root *os.File // the delegated cgroup's directory; nil: none
	log  *slog.Logger
	seq  atomic.Uint64
	// off is set after a failure to make or use a cgroup: execs then run
	// without one (logged once).
	off atomic.Bool

	// mu guards lingering.
	mu sync.Mutex
	// lingering are cgroups of finished execs that still held processes.
	lingering map[string]struct{}
}

func newExecCgroups(root *os.File, log *slog.Logger) *execCgroups {
	return &execCgroups{root: root, log: log, lingering: make(map[string]struct{})}
}

// create makes the cgroup of a new exec and returns its name and an O_PATH
// descriptor of it for clone3, which the caller closes after the fork. It
// returns "" and -1 when execs get no cgroup.
func (c *execCgroups) create() (string, int) {
	if c.root == nil || c.off.Load() {
		return "", -1
	}
	name := "exec-" + strconv.FormatUint(c.seq.Add(1), 10)
	rootFD := int(c.root.Fd())
	if err := unix.Mkdirat(rootFD, name, 0o755); err != nil {
		c.disable("making an exec cgroup", err)
		return "", -1
	}
	fd, err := unix.Openat(rootFD, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Unlinkat(rootFD, name, unix.AT_REMOVEDIR)
		c.disable("opening an exec cgroup", err)
		return "", -1
	}
	return name, fd
}

// disable turns per-exec cgroups off after err.
func (c *execCgroups) disable(what string, err error) {
	if !c.off.Swap(true) {
		c.log.Warn("per-exec cgroups disabled: a timeout reaches the exec's process group only", "op", what, "err", err)
	}
}

// forkFailed removes the cgroup of an exec whose start failed and, when
// clone3 into it is what failed, turns per-exec cgroups off.
func (c *execCgroups) forkFailed(name string, err error) {
	c.remove(name)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) {
		c.disable("starting a process in its exec cgroup", err)
	}
}

// kill SIGKILLs every process in the exec cgroup name.
func (c *execCgroups) kill(name string) error {
	if name == "" {
		return nil
	}
	fd, err := unix.Openat(int(c.root.Fd()), name+"/cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("killing exec cgroup %s: %w", name, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte("1")); err != nil {
		return fmt.Errorf("killing exec cgroup %s: %w", name, err)
	}
	return nil
}

// release removes the cgroup of a finished exec, or keeps it for sweep
// while processes of the exec still run.
func (c *execCgroups) release(name string) {
	if name == "" {
		return
	}
	if err := unix.Unlinkat(int(c.root.Fd()), name, unix.AT_REMOVEDIR); err == nil || errors.Is(err, unix.ENOENT) {
		return
	}
	c.mu.Lock()
	c.lingering[name] = struct{}{}
	c.mu.Unlock()
}

func (c *execCgroups) remove(name string) {
	_ = unix.Unlinkat(int(c.root.Fd()), name, unix.AT_REMOVEDIR)
}

// sweep removes the lingering cgroups that have emptied. The reaper calls
// it after each pass that reaped an orphan, the only way a lingering
// cgroup empties.
func (c *execCgroups) sweep() {
	if c.root == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.lingering {
		err := unix.Unlinkat(int(c.root.Fd()), name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			delete(c.lingering, name)
		}
	}
}
