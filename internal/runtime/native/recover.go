package native

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

// state is what Sandbox.State returns and Recover reads back.
type state struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // field 22 of /proc/<pid>/stat, guards against pid reuse
	Cgroup    string `json:"cgroup"`
}

// Recover re-adopts a sandbox from its State. The guest must still run as
// the same process (pid and start time: procwatch.Open) and be in the
// sandbox's cgroup, under the backend's parent or, for a sandbox of an
// earlier version, LegacyCgroupParent; otherwise it fails with
// errdefs.ErrNotFound. The adopted guest is not our child, so its exit is
// watched through a pidfd (procwatch.Watch).
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
	proc, err := procwatch.Open(st.Pid, st.StartTime)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: guest: %w", spec.ID, err)
	}
	defer proc.Close()
	cg, err := loadCgroup(b.mode, st.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	if in, err := cg.contains(st.Pid); err != nil || !in {
		return nil, fmt.Errorf("recovering sandbox %s: pid %d is not in cgroup %s: %w", spec.ID, st.Pid, st.Cgroup, errdefs.ErrNotFound)
	}
	done, err := proc.Watch()
	if err != nil {
		return nil, fmt.Errorf("recovering sandbox %s: %w", spec.ID, err)
	}
	b.log.InfoContext(ctx, "sandbox recovered", "sandbox", spec.ID, "pid", st.Pid)
	return newSandbox(b, spec, cg, st, done), nil
}
