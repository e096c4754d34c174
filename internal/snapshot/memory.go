package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Memory checkpoints (api.CreateCheckpointRequest.Memory): the
// filesystem checkpoint plus the backend's image of the sandbox's memory
// and processes (runtime.MemoryCheckpointer, through
// sandbox.Handle.CheckpointMemory), stored in a directory of its own
// under Config.MemoryDir named for the checkpoint and deleted with it.
// Restore (sandbox.Handle.ResetMemory) and fork (ForkSpec.MemoryImage)
// continue the processes from it on the source's backend.
//
// A process started with secrets or a run token (a private exec) holds
// them in its memory, and so does the guest that started it: it was
// given them in its request, and its buffers are not scrubbed (a memory
// image of a sandbox whose private process was long gone held the
// secret in the guest's pages: test/TestSecretsNotInCheckpointsOrHostFilesGvisor).
// So a memory checkpoint, which would copy them into the image and every
// fork, is refused unless the caller sets AllowSecretsInMemory while a
// private process runs, and also once the sandbox's guest has started
// any (proto.ActivityReply.PrivateExecs), until the sandbox gets a fresh
// guest (a restore from a filesystem checkpoint, a wake from hibernation).

// prepareMemory checks that h may be checkpointed with its memory and
// makes the image's directory for checkpoint cid.
func (m *Snapshots) prepareMemory(ctx context.Context, h *sandbox.Handle, req api.CreateCheckpointRequest, cid string) (string, error) {
	if m.mem == "" {
		return "", fmt.Errorf("memory checkpoints need a memory directory: %w", errdefs.ErrFailedPrecondition)
	}
	if !req.AllowSecretsInMemory {
		g := h.Guest()
		if g == nil {
			return "", fmt.Errorf("sandbox %s has no guest: %w", h.ID(), errdefs.ErrConflict)
		}
		procs, err := g.Processes(ctx)
		if err != nil {
			return "", fmt.Errorf("listing processes: %w", err)
		}
		for _, p := range procs {
			if p.Running && p.Private {
				return "", fmt.Errorf("process %d (%s) was started with secrets or a run token and still runs: its memory would be in the checkpoint and every fork of it; set allow_secrets_in_memory to take it anyway: %w",
					p.Pid, strings.Join(p.Cmd, " "), errdefs.ErrFailedPrecondition)
			}
		}
		act, err := g.Activity(ctx)
		if err != nil && !errors.Is(err, errdefs.ErrNotImplemented) {
			return "", fmt.Errorf("asking the guest about its private execs: %w", err)
		}
		if act.PrivateExecs > 0 {
			return "", fmt.Errorf("the sandbox's guest has started %d processes with secrets or a run token since it started: its memory may still hold them, and would be in the checkpoint and every fork of it; set allow_secrets_in_memory to take it anyway (a restore from a filesystem checkpoint gives the sandbox a fresh guest): %w",
				act.PrivateExecs, errdefs.ErrFailedPrecondition)
		}
	}
	if err := os.MkdirAll(m.mem, 0o700); err != nil {
		return "", fmt.Errorf("memory directory: %w", err)
	}
	dir := filepath.Join(m.mem, cid)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("memory image: %w", err)
	}
	return dir, nil
}

// removeMemory removes a memory image's directory; only ever one under
// the memory directory.
func (m *Snapshots) removeMemory(dir string) {
	if dir == "" || m.mem == "" || filepath.Dir(dir) != filepath.Clean(m.mem) {
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		m.log.Warn("removing a memory image", "dir", dir, "err", err)
	}
}

// dropUnused removes layer id, just made for a checkpoint that failed,
// when nothing references it.
func (m *Snapshots) dropUnused(ctx context.Context, id string) {
	l, err := m.ls.Get(id)
	if err != nil || len(l.Refs) > 0 {
		return
	}
	if err := m.ls.Remove(ctx, id); err != nil && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
		m.log.WarnContext(ctx, "removing layer", "layer", id, "err", err)
	}
}
