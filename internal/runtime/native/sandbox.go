package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

// destroyWaitTimeout bounds how long Destroy waits for the guest to be gone
// after its cgroup was emptied, when ctx has no earlier deadline.
const destroyWaitTimeout = 10 * time.Second

// sandbox is a created or recovered native sandbox.
type sandbox struct {
	spec runtime.Spec
	st   state
	cg   cgroupManager
	done <-chan struct{} // closed when the guest has exited
	log  *slog.Logger
	// yield is the backend's CPU yield policy (nil: off); paused is set
	// while the sandbox is frozen, for it, and cpuBound by it.
	yield    *yielder
	paused   atomic.Bool
	cpuBound atomic.Bool // the yielder has it yield

	// mu serialises Destroy, Pause and Resume, and guards destroyed.
	mu        sync.Mutex
	destroyed bool
}

func newSandbox(b *Backend, spec runtime.Spec, cg cgroupManager, st state, done <-chan struct{}) *sandbox {
	s := &sandbox{spec: spec, st: st, cg: cg, done: done, log: b.log.With("sandbox", spec.ID), yield: b.yield}
	b.yield.add(s)
	return s
}

func (s *sandbox) ID() string            { return s.spec.ID }
func (s *sandbox) SocketPath() string    { return s.spec.SocketPath }
func (s *sandbox) Wait() <-chan struct{} { return s.done }

// State returns {pid, start_time, cgroup} as JSON.
func (s *sandbox) State() []byte {
	b, _ := json.Marshal(s.st)
	return b
}

// Status is running until the guest (PID 1 of the sandbox) has exited.
func (s *sandbox) Status(ctx context.Context) (runtime.Status, error) {
	return procwatch.Status(s.done), nil
}

// Destroy kills every process in the sandbox's cgroup (escaped session
// leaders and double forks stay in the cgroup), waits for the guest to be
// gone, and removes the cgroup, socket and state dir. The mounts lived only
// in the sandbox's mount namespace, which dies with its last process.
func (s *sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil
	}
	if err := s.cg.killAll(ctx); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.spec.ID, err)
	}
	if err := procwatch.WaitExit(ctx, s.done, destroyWaitTimeout); err != nil {
		return fmt.Errorf("destroying sandbox %s: guest pid %d: %w", s.spec.ID, s.st.Pid, err)
	}
	if err := s.cg.delete(); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.spec.ID, err)
	}
	if err := removeFiles(s.spec); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.spec.ID, err)
	}
	s.destroyed = true
	s.yield.remove(s)
	s.log.InfoContext(ctx, "sandbox destroyed")
	return nil
}

// Pause freezes every process of the sandbox.
func (s *sandbox) Pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("pausing sandbox %s: destroyed: %w", s.spec.ID, errdefs.ErrNotFound)
	}
	if err := s.cg.freeze(ctx); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", s.spec.ID, err)
	}
	s.paused.Store(true)
	return nil
}

// Resume thaws a paused sandbox.
func (s *sandbox) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("resuming sandbox %s: destroyed: %w", s.spec.ID, errdefs.ErrNotFound)
	}
	if err := s.cg.thaw(ctx); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", s.spec.ID, err)
	}
	s.paused.Store(false)
	return nil
}

// Stats reads the cgroup's counters.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	st, err := s.cg.stats()
	st.CPUBound = s.cpuBound.Load()
	if err != nil {
		// ENOENT: the cgroup is gone before the first read; ENODEV or a
		// closed file: it was removed after.
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, os.ErrClosed) {
			return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", s.spec.ID, errdefs.ErrNotFound)
		}
		return runtime.Stats{}, err
	}
	return st, nil
}
