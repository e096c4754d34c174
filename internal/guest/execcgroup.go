package guest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
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
// "cmd &" always did); its cgroup is reused or removed once they are gone
// (sweep). Empty cgroups are kept for the next execs (up to maxIdle): a
// mkdir and rmdir of a cgroup cost about 0.4 ms together, a fifth of an
// exec, where reusing one costs a read of cgroup.events.
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

	// mu guards the fields below.
	mu sync.Mutex
	// lingering are cgroups of finished execs that still held processes.
	lingering map[string]struct{}
	// idle are empty cgroups ready for the next exec.
	idle []string
	// killed are cgroups whose cgroup.kill was written: never reused.
	// (Linux 6.18 kills every process later cloned into such a cgroup
	// with CLONE_INTO_CGROUP: the fork compares the cgroup's kill count
	// with its parent's.)
	killed map[string]bool
}

// maxIdle is how many empty exec cgroups are kept for reuse.
const maxIdle = 8

func newExecCgroups(root *os.File, log *slog.Logger) *execCgroups {
	return &execCgroups{root: root, log: log, lingering: make(map[string]struct{}), killed: make(map[string]bool)}
}

// create makes the cgroup of a new exec and returns its name and an O_PATH
// descriptor of it for clone3, which the caller closes after the fork. It
// returns "" and -1 when execs get no cgroup.
func (c *execCgroups) create() (string, int) {
	if c.root == nil || c.off.Load() {
		return "", -1
	}
	rootFD := int(c.root.Fd())
	c.mu.Lock()
	var name string
	if n := len(c.idle); n > 0 {
		name, c.idle = c.idle[n-1], c.idle[:n-1]
	}
	c.mu.Unlock()
	if name == "" {
		name = "exec-" + strconv.FormatUint(c.seq.Add(1), 10)
		if err := unix.Mkdirat(rootFD, name, 0o755); err != nil {
			c.disable("making an exec cgroup", err)
			return "", -1
		}
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

// kill SIGKILLs every process in the exec cgroup name.
func (c *execCgroups) kill(name string) error {
	if name == "" {
		return nil
	}
	c.mu.Lock()
	c.killed[name] = true
	c.mu.Unlock()
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

// release keeps the cgroup of a finished exec for reuse (or removes it)
// once empty, and for sweep while processes of the exec still run.
func (c *execCgroups) release(name string) {
	if name == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.recycleLocked(name) {
		c.lingering[name] = struct{}{}
	}
}

// recycleLocked reports whether cgroup name is empty and, if so, keeps it
// idle or (when killed once, or enough are idle) removes it.
func (c *execCgroups) recycleLocked(name string) bool {
	if !c.emptyLocked(name) {
		return false
	}
	if len(c.idle) < maxIdle && !c.killed[name] {
		c.idle = append(c.idle, name)
		return true
	}
	err := unix.Unlinkat(int(c.root.Fd()), name, unix.AT_REMOVEDIR)
	if err == nil || errors.Is(err, unix.ENOENT) {
		delete(c.killed, name)
		return true
	}
	return false
}

// emptyLocked reports whether cgroup name holds no process (cgroup.events
// says "populated 0"). Nothing can enter an empty exec cgroup but the
// guest's next exec: sandbox processes cannot reach the cgroup tree.
func (c *execCgroups) emptyLocked(name string) bool {
	fd, err := unix.Openat(int(c.root.Fd()), name+"/cgroup.events", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var buf [128]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return false
	}
	return populatedZero(buf[:n])
}

// populatedZero reports whether a cgroup.events text has "populated 0".
func populatedZero(b []byte) bool {
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(line) == "populated 0" {
			return true
		}
	}
	return false
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
		if c.recycleLocked(name) {
			delete(c.lingering, name)
		}
	}
}
