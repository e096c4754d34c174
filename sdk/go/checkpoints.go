package agentbox

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Checkpoint is the description of a checkpoint: an immutable saved state
// of a sandbox's filesystem that it can be restored to and forked from.
type Checkpoint = api.Checkpoint

// CheckpointOptions name and label a checkpoint; both are optional.
type CheckpointOptions = api.CreateCheckpointRequest

// ForkOptions set the labels and extra environment of forks.
type ForkOptions struct {
	Labels map[string]string
	Env    map[string]string
}

// Checkpoint saves the sandbox's filesystem under name (may be empty). The
// sandbox is frozen while its changes are captured; its processes go on
// afterwards.
func (s *Sandbox) Checkpoint(ctx context.Context, name string) (Checkpoint, error) {
	return s.CheckpointWith(ctx, CheckpointOptions{Name: name})
}

// CheckpointWith is Checkpoint with labels, or with the sandbox's memory
// and processes too (opts.Memory; gvisor sandboxes): restore and fork of
// such a checkpoint continue its processes.
func (s *Sandbox) CheckpointWith(ctx context.Context, opts CheckpointOptions) (Checkpoint, error) {
	var ck Checkpoint
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/checkpoints"), json: opts}, &ck); err != nil {
		return Checkpoint{}, wrapf(err, "checkpointing sandbox %s", s.id)
	}
	return ck, nil
}

// Checkpoints lists the sandbox's checkpoints, oldest first.
func (s *Sandbox) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	var list api.CheckpointList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/checkpoints")}, &list); err != nil {
		return nil, wrapf(err, "listing checkpoints of sandbox %s", s.id)
	}
	return list.Checkpoints, nil
}

// Restore puts the sandbox back to a checkpoint (its id, or the name of one
// of the sandbox's checkpoints): every process is stopped and every file is
// as it was when the checkpoint was taken. It returns how long that took.
func (s *Sandbox) Restore(ctx context.Context, checkpoint string) (api.RestoreResult, error) {
	var res api.RestoreResult
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/restore"), json: api.RestoreRequest{Checkpoint: checkpoint}}, &res); err != nil {
		return api.RestoreResult{}, wrapf(err, "restoring sandbox %s", s.id)
	}
	s.mu.Lock()
	s.info = res.Sandbox
	s.mu.Unlock()
	return res, nil
}

// Fork checkpoints the sandbox and creates n sandboxes from that checkpoint,
// each with its own writable layer and a fresh identity.
func (s *Sandbox) Fork(ctx context.Context, n int, opts ...ForkOptions) ([]*Sandbox, error) {
	var res api.ForkResult
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/fork"), json: forkRequest(n, opts)}, &res); err != nil {
		return nil, wrapf(err, "forking sandbox %s", s.id)
	}
	return s.c.sandboxes(res.Sandboxes), nil
}

// Fork creates n sandboxes from checkpoint cid.
func (c *Client) Fork(ctx context.Context, cid string, n int, opts ...ForkOptions) ([]*Sandbox, error) {
	var res api.ForkResult
	if err := c.call(ctx, request{method: http.MethodPost, path: checkpointPath(cid) + "/fork", json: forkRequest(n, opts)}, &res); err != nil {
		return nil, wrapf(err, "forking checkpoint %s", cid)
	}
	return c.sandboxes(res.Sandboxes), nil
}

// Checkpoint returns one checkpoint.
func (c *Client) Checkpoint(ctx context.Context, cid string) (Checkpoint, error) {
	var ck Checkpoint
	if err := c.call(ctx, request{method: http.MethodGet, path: checkpointPath(cid)}, &ck); err != nil {
		return Checkpoint{}, wrapf(err, "getting checkpoint %s", cid)
	}
	return ck, nil
}

// Checkpoints lists every checkpoint, oldest first.
func (c *Client) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	var list api.CheckpointList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/checkpoints"}, &list); err != nil {
		return nil, wrapf(err, "listing checkpoints")
	}
	return list.Checkpoints, nil
}

// DeleteCheckpoint deletes a checkpoint; IsConflict(err) while a sandbox
// runs on it.
func (c *Client) DeleteCheckpoint(ctx context.Context, cid string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: checkpointPath(cid)}, nil); err != nil {
		return wrapf(err, "deleting checkpoint %s", cid)
	}
	return nil
}

// WithCheckpoint checkpoints the sandbox before the command runs; the
// checkpoint's id is in Result.Checkpoint.
func WithCheckpoint() ExecOption { return func(r *api.ExecRequest) { r.CheckpointBefore = true } }

// WithRollbackOnFailure checkpoints the sandbox before the command runs and
// puts its files back to that checkpoint when it exits non-zero, is killed
// or times out (Result.RolledBack), before Run returns. The files are
// reverted through the running guest: other processes keep running.
func WithRollbackOnFailure() ExecOption {
	return func(r *api.ExecRequest) { r.CheckpointBefore, r.RollbackOnFailure = true, true }
}

func forkRequest(n int, opts []ForkOptions) api.ForkRequest {
	req := api.ForkRequest{Count: n}
	for _, o := range opts {
		req.Labels, req.Env = o.Labels, o.Env
	}
	return req
}

func (c *Client) sandboxes(infos []api.Sandbox) []*Sandbox {
	out := make([]*Sandbox, len(infos))
	for i, info := range infos {
		out[i] = c.sandbox(info)
	}
	return out
}

func checkpointPath(cid string) string { return "/checkpoints/" + url.PathEscape(cid) }
