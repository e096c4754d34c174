package guest

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the only place that calls wait4. As PID 1 of a sandbox the
// guest inherits every orphan; the reaper collects all of them and hands
// the statuses of processes it started to their waiters, keyed by pid.
//
// Mixing this with os/exec's Wait is not possible (each would steal the
// other's statuses): every child of the guest is started through
// reaper.start.
type reaper struct {
	// forkMu is held for reading while a child is forked and registered,
	// and for writing around each wait4 pass, so a child that exits at once
	// is never reaped before its waiter is registered.
	forkMu sync.RWMutex

	// mu guards waiters.
	mu      sync.Mutex
	waiters map[int]func(syscall.WaitStatus)

	sigc chan os.Signal
	stop chan struct{}
	done chan struct{}
	// orphansGone, when set, is called after a pass that reaped a process
	// the reaper did not start (an orphan), and once a second, from the
	// reaper's goroutine.
	orphansGone func()
	// own: wait only for the registered pids (Options.Embedded), never
	// wait4(-1), which would take other code's children.
	own bool
}

func newReaper(orphansGone func(), own bool) *reaper {
	r := &reaper{
		orphansGone: orphansGone,
		own:         own,
		waiters:     make(map[int]func(syscall.WaitStatus)),
		sigc:        make(chan os.Signal, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	signal.Notify(r.sigc, syscall.SIGCHLD)
	go r.loop()
	return r
}

// start runs fork (a fork and exec, perhaps on another thread: see
// domains) and registers onExit for the child it started, which the reaper
// calls (from its own goroutine, so it must not block) with the child's
// wait status.
func (r *reaper) start(fork func() (int, error), onExit func(syscall.WaitStatus)) (int, error) {
	r.forkMu.RLock()
	defer r.forkMu.RUnlock()
	pid, err := fork()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.waiters[pid] = onExit
	r.mu.Unlock()
	return pid, nil
}

func (r *reaper) loop() {
	defer close(r.done)
	// A periodic pass guards against a lost SIGCHLD (signals coalesce, and
	// a child forked between two passes is picked up by the next one).
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-r.sigc:
		case <-tick.C:
			// Also now and then without an orphan reaped: a cgroup
			// that emptied just before it was recorded lingering.
			if r.orphansGone != nil {
				r.orphansGone()
			}
		case <-r.stop:
			signal.Stop(r.sigc)
			r.reapAll()
			return
		}
	}
}

// reapAll collects every exited child without blocking.
func (r *reaper) reapAll() {
	if r.reapPass() && r.orphansGone != nil {
		r.orphansGone()
	}
}

// reapPass collects every exited child without blocking and reports
// whether one was an orphan.
func (r *reaper) reapPass() (orphans bool) {
	r.forkMu.Lock()
	defer r.forkMu.Unlock()
	if r.own {
		r.reapOwnLocked()
		return false
	}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return orphans // ECHILD: no children; 0: none exited
		}
		r.mu.Lock()
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if fn != nil {
			fn(ws)
		} else {
			// Unknown pids are orphans reparented to us: reaped silently.
			orphans = true
		}
	}
}

// reapOwnLocked collects the exited processes among those registered,
// without blocking. forkMu is held.
func (r *reaper) reapOwnLocked() {
	r.mu.Lock()
	pids := make([]int, 0, len(r.waiters))
	for pid := range r.waiters {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for errors.Is(err, syscall.EINTR) {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if err != nil || got != pid {
			continue // still running (0), or not our child any more
		}
		r.mu.Lock()
		fn := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if fn != nil {
			fn(ws)
		}
	}
}

// close stops the reaper after a last pass.
func (r *reaper) close() {
	close(r.stop)
	<-r.done
}

// markFDsCloexec sets FD_CLOEXEC on every descriptor above stderr, so
// nothing the guest inherited leaks into the processes it starts. Go opens
// all its own descriptors with O_CLOEXEC.
func markFDsCloexec() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	entries, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	for _, e := range entries {
		fd, serr := strconv.Atoi(e.Name())
		if serr != nil || fd < 3 {
			continue
		}
		unix.CloseOnExec(fd)
	}
	return nil
}
