package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

// state is what Sandbox.State returns and Recover reads back. Fields are
// only ever added.
type state struct {
	// Pid is the sandbox process (runsc's "runsc-sandbox", the sentry),
	// StartTime field 22 of its /proc/<pid>/stat, against pid reuse.
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	// ContainerID and Root name the runsc container (runsc --root=Root/runsc
	// ... ContainerID): what runsc pause, checkpoint or restore are given.
	ContainerID string `json:"container_id"`
	Root        string `json:"root"`
	Bundle      string `json:"bundle"`
	Cgroup      string `json:"cgroup"`
	// Nonce is the guest's secret of its last quiesce (memory.go): what
	// its control socket authenticates the host with. "" before the
	// first.
	Nonce string `json:"nonce,omitempty"`
}

// sandbox is a created or recovered gVisor sandbox.
type sandbox struct {
	b    *Backend
	spec runtime.Spec
	st   state
	done <-chan struct{} // closed when the sandbox process has exited
	log  *slog.Logger

	// mu serialises Destroy, Pause, Resume and CheckpointMemory, and
	// guards destroyed and st.Nonce.
	mu        sync.Mutex
	destroyed bool
}

func (b *Backend) newSandbox(spec runtime.Spec, st state, done <-chan struct{}) *sandbox {
	return &sandbox{b: b, spec: spec, st: st, done: done, log: b.log.With("sandbox", spec.ID)}
}

func (s *sandbox) ID() string            { return s.spec.ID }
func (s *sandbox) SocketPath() string    { return s.spec.SocketPath }
func (s *sandbox) Wait() <-chan struct{} { return s.done }

// State returns the state as JSON.
func (s *sandbox) State() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(s.st)
	return b
}

// Status is running until the sandbox process (which ends with the guest)
// has exited.
func (s *sandbox) Status(ctx context.Context) (runtime.Status, error) {
	return procwatch.Status(s.done), nil
}

// Destroy deletes the runsc container (killing the sentry, its gofer and
// so every sandbox process, which are the sentry's tasks), waits for the
// sandbox process to be gone, and removes the cgroup, the bundle's mounts,
// the bundle, the socket and the state dir. Idempotent; works on a paused
// sandbox.
func (s *sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil
	}
	if err := s.b.deleteContainer(ctx, s.spec.ID); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.spec.ID, err)
	}
	if err := procwatch.WaitExit(ctx, s.done, teardownTimeout); err != nil {
		return fmt.Errorf("destroying sandbox %s: sandbox pid %d: %w", s.spec.ID, s.st.Pid, err)
	}
	if err := s.b.removeRest(ctx, s.spec); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.spec.ID, err)
	}
	s.destroyed = true
	s.log.InfoContext(ctx, "sandbox destroyed")
	return nil
}

// Pause stops every task of the sandbox in the sentry (runsc pause). A
// paused sandbox stays paused: nil, as a frozen cgroup frozen again.
func (s *sandbox) Pause(ctx context.Context) error {
	return s.pauseResume(ctx, "pause", "paused")
}

// Resume restarts a paused sandbox's tasks (runsc resume). A running
// sandbox is left running: nil (a restarted daemon thaws every sandbox
// it re-adopts, in case its predecessor died with one frozen).
func (s *sandbox) Resume(ctx context.Context) error {
	return s.pauseResume(ctx, "resume", "running")
}

func (s *sandbox) pauseResume(ctx context.Context, verb, want string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("%s sandbox %s: destroyed: %w", verb, s.spec.ID, errdefs.ErrNotFound)
	}
	_, err := s.b.runsc(ctx, verb, s.spec.ID)
	if err == nil {
		return nil
	}
	if notExist(err) {
		return fmt.Errorf("%s sandbox %s: %w: %w", verb, s.spec.ID, err, errdefs.ErrNotFound)
	}
	if st, serr := s.b.containerState(ctx, s.spec.ID); serr == nil && st.Status == want {
		return nil
	}
	return fmt.Errorf("%s sandbox %s: %w", verb, s.spec.ID, err)
}

// runscState is what runsc state reports of a container.
type runscState struct {
	Pid    int    `json:"pid"`
	Status string `json:"status"` // "created", "running", "paused", "stopped"
}

// containerState runs runsc state on id.
func (b *Backend) containerState(ctx context.Context, id string) (runscState, error) {
	var st runscState
	out, err := b.runsc(ctx, "state", id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("runsc state %s: %w", id, err)
	}
	return st, nil
}

// Stats is Counters plus the sandbox's tasks as the sentry counts them
// (runsc events --stats: what its pids limit, RLIMIT_NPROC, holds), or the
// host cgroup's tasks when the sentry does not answer.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	st, err := s.hostCounters()
	if err != nil {
		return st, err
	}
	if out, err := s.b.runsc(ctx, "events", "--stats", s.spec.ID); err == nil {
		var ev struct {
			Data struct {
				Pids struct {
					Current int64 `json:"current"`
				} `json:"pids"`
			} `json:"data"`
		}
		if json.Unmarshal(out, &ev) == nil && ev.Data.Pids.Current > 0 {
			st.Pids = ev.Data.Pids.Current
		}
	}
	return st, nil
}

// Counters reads the counters of the sandbox's host cgroup alone: the
// sentry's and the gofer's CPU time and memory, and OOM kills; Pids is 0
// (the host's count would be the sentry's threads, not the sandbox's
// tasks). No runsc subprocess: what the core samples around every exec.
func (s *sandbox) Counters(ctx context.Context) (runtime.Stats, error) {
	st, err := s.hostCounters()
	st.Pids = 0
	return st, err
}

// hostCounters reads the sandbox's host cgroup (Pids: its host tasks).
func (s *sandbox) hostCounters() (runtime.Stats, error) {
	st, err := readStats(s.b.mode, s.st.Cgroup)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", s.spec.ID, errdefs.ErrNotFound)
		}
		return runtime.Stats{}, fmt.Errorf("sandbox %s: stats: %w", s.spec.ID, err)
	}
	return st, nil
}

// deleteContainer runs runsc delete --force on id; a container runsc does
// not know is already deleted.
func (b *Backend) deleteContainer(ctx context.Context, id string) error {
	if _, err := b.runsc(ctx, "delete", "--force", id); err != nil && !notExist(err) {
		return err
	}
	return nil
}

// removeRest removes what is left of spec's sandbox once its container is
// deleted: processes still in its cgroup and the cgroup, the bundle and its
// mounts, the socket and the state dir.
func (b *Backend) removeRest(ctx context.Context, spec runtime.Spec) error {
	var errs []error
	if err := killCgroup(ctx, b.cgroupDirs(spec.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := unmountBundle(b.bundleDir(spec.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(spec.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if spec.StateDir != "" {
		if err := os.RemoveAll(spec.StateDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// destroyPollInterval is how often killCgroup looks whether the cgroup
// emptied.
const destroyPollInterval = 10 * time.Millisecond
