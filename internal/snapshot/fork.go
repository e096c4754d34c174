package snapshot

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/validate"
)

// Limits of a fork request.
const (
	maxForks         = 64
	forkParallelism  = 4
	implicitForkName = "fork"
	// LabelImplicit marks checkpoints the daemon took on its own (before a
	// fork of a live sandbox, before a transactional exec).
	LabelImplicit = "agentbox.implicit"
)

// ForkCheckpoint creates req.Count (default 1) sandboxes from checkpoint
// cid: a checkpoint id, or a name (the newest of the caller's own
// checkpoints of that name, as Restore resolves names). Each runs on the checkpoint's layers with its own empty writable
// layer, and has a fresh identity: new id and hostname, and its own
// /etc/machine-id and /var/lib/systemd/random-seed, never the source's.
// Forks inherit the source sandbox's template, resources and environment
// (req.Env is merged over it) and carry req.Labels. All or nothing: on
// error no fork is left.
func (m *Snapshots) ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (_ api.ForkResult, err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpFork, "", cid, start, err) }()
	if err := validateFork(&req); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", cid, err)
	}
	// Resolved as restore resolves its checkpoint: an id, else the
	// newest of the caller's own checkpoints of that name (names are per
	// tenant, like sandbox names).
	owner := tenant.Owner(tenant.From(ctx).Tenant)
	ck, err := m.findCheckpointNamed(ctx, cid, func(c api.Checkpoint) bool { return tenant.Owner(c.Tenant) == owner })
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking: %w", err)
	}
	return m.fork(ctx, ck, req)
}

// ForkSandbox checkpoints sandbox id (a checkpoint named "fork" labelled
// agentbox.implicit=fork, listed like any other) and forks it; see
// ForkCheckpoint. A paused or hibernated source is not woken and stays so
// (CreateCheckpoint).
func (m *Snapshots) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (_ api.ForkResult, err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpFork, id, "", start, err) }()
	if err := validateFork(&req); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	h, unlock, err := m.sbx.LockFiles(ctx, id)
	if err != nil {
		return api.ForkResult{}, err
	}
	ck, err := m.checkpointLocked(ctx, h, api.CreateCheckpointRequest{Name: implicitForkName, Labels: map[string]string{LabelImplicit: "fork"}})
	unlock()
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	res, err := m.fork(ctx, ck, req)
	// Older implicit checkpoints of the source may go; this one is the
	// forks' base (or, on error, taken for nothing and pruned in turn).
	m.PruneImplicit(ctx, id)
	return res, err
}

func validateFork(req *api.ForkRequest) error {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > maxForks {
		return fmt.Errorf("count must be between 1 and %d: %w", maxForks, errdefs.ErrInvalidArgument)
	}
	if err := validate.Labels(req.Labels); err != nil {
		return err
	}
	return validate.Env(req.Env)
}

func (m *Snapshots) fork(ctx context.Context, ck store.CheckpointRecord, req api.ForkRequest) (api.ForkResult, error) {
	_, ls, err := m.checkpoints()
	if err != nil {
		return api.ForkResult{}, err
	}
	defer m.pin(ck.Checkpoint.ID)() // not pruned before the forks stand on it
	paths, err := ls.Paths(ck.Layer)
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	// Forks belong to the checkpoint's tenant and count against its quotas.
	release, err := m.admitSandboxes(ctx, ck.Checkpoint.Tenant, req.Count, ck.Resources.DiskBytes)
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	defer release()
	// One synced layer-metadata write references the checkpoint's layer
	// for every fork (the forks then start concurrently); forks that do
	// not come to be release theirs at the end.
	ids := make([]string, req.Count)
	owners := make([]string, req.Count)
	for i := range ids {
		ids[i] = sandbox.NewID()
		owners[i] = sandbox.LayerOwner(ids[i])
	}
	if err := ls.RefAll(ctx, ck.Layer, owners); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	var (
		mu    sync.Mutex
		forks = make([]api.Sandbox, req.Count)
	)
	defer func() {
		var unused []string
		for i, sb := range forks {
			if sb.ID == "" {
				unused = append(unused, owners[i])
			}
		}
		if len(unused) > 0 {
			if err := ls.UnrefAll(context.WithoutCancel(ctx), ck.Layer, unused); err != nil {
				m.log.WarnContext(ctx, "releasing layer references of failed forks", "layer", ck.Layer, "err", err)
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(forkParallelism)
	for i := range req.Count {
		g.Go(func() error {
			sb, err := m.forkOne(gctx, ids[i], ck, paths, req)
			if err != nil {
				return err
			}
			mu.Lock()
			forks[i] = sb
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		for i, sb := range forks {
			if sb.ID != "" {
				if derr := m.sbx.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
					m.log.ErrorContext(ctx, "deleting fork after a failed fork", "sandbox", sb.ID, "err", derr)
				}
				forks[i].ID = "" // its reference was dropped with it; UnrefAll is idempotent
			}
		}
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	m.log.InfoContext(ctx, "checkpoint forked", "checkpoint", ck.Checkpoint.ID, "count", req.Count)
	return api.ForkResult{Checkpoint: ck.Checkpoint.ID, Sandboxes: forks}, nil
}

// forkOne creates fork id of ck whose layers are paths. The caller holds
// the fork's reference on ck's layer (sandbox.LayerOwner(id)).
func (m *Snapshots) forkOne(ctx context.Context, id string, ck store.CheckpointRecord, paths []string, req api.ForkRequest) (api.Sandbox, error) {
	env := maps.Clone(ck.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range req.Env {
		env[k] = v
	}
	return m.sbx.CreateFork(ctx, sandbox.ForkSpec{
		ID:         id,
		Base:       ck.Checkpoint.ID,
		Layers:     paths,
		Tenant:     ck.Checkpoint.Tenant,
		Template:   ck.Checkpoint.Template,
		TemplateID: ck.TemplateID,
		Env:        env,
		Labels:     req.Labels,
		Resources:  ck.Resources,
		Runtime:    ck.Backend,
		// A memory checkpoint's forks continue its processes.
		MemoryImage: ck.MemoryImage,
	})
}
