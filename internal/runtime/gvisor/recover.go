package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

// Recover re-adopts a sandbox from its State: the sandbox process must
// still run as the same process (pid and start time: procwatch.Open) and
// runsc must know the container with that pid, running or paused;
// otherwise it fails with errdefs.ErrNotFound. The process is not our
// child: its exit is watched through a pidfd (procwatch.Watch).
func (b *Backend) Recover(ctx context.Context, spec runtime.Spec, raw []byte) (runtime.Sandbox, error) {
	if !idPattern.MatchString(spec.ID) {
		return nil, fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	st, err := parseState(raw, spec.ID)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	proc, err := procwatch.Open(st.Pid, st.StartTime)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: sandbox process: %w", spec.ID, err)
	}
	defer proc.Close()
	rs, err := b.containerState(ctx, spec.ID)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %v: %w", spec.ID, err, errdefs.ErrNotFound)
	}
	if rs.Pid != st.Pid || (rs.Status != "running" && rs.Status != "paused") {
		return nil, fmt.Errorf("recovering sandbox %s: runsc reports pid %d %q: %w", spec.ID, rs.Pid, rs.Status, errdefs.ErrNotFound)
	}
	done, err := proc.Watch()
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
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
