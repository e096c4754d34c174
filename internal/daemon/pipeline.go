package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/pipeline"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxnet"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/snapshot"
	"github.com/agentbox/agentbox/internal/store"
)

// hookKeyPurpose derives the key that seals webhook secrets from the
// master secrets key.
const hookKeyPurpose = "agentbox hook secrets v1"

// pipelineAPI is the execution pipeline with its triggers, as the HTTP
// edge sees it (httpapi.RunService, ScheduleService, HookService). API
// exec reaches the pipeline through service.Exec and StartProcess below.
type pipelineAPI struct {
	p     *pipeline.Pipeline
	sched *pipeline.Scheduler
	hooks *pipeline.Hooks
	log   *slog.Logger
}

var (
	_ httpapi.RunService      = service{}
	_ httpapi.ScheduleService = service{}
	_ httpapi.HookService     = service{}
)

// newPipeline builds the execution pipeline, its scheduler and webhooks
// without starting anything: the daemon connects the tenants' quota
// meters to it first (connectTenants), then starts it (start) once the
// sandboxes are recovered. Webhook secrets are sealed with a key derived
// from the master secrets key (read again from its file, created by
// setupSecrets).
// pipelineSandboxes is what the pipeline runs on: the Manager, the
// network feature's egress log (pipeline.EgressLogger: runs are charged
// their egress bytes), and the checkpoint feature's exec transactions.
type pipelineSandboxes struct {
	*sandbox.Manager
	*sandboxnet.Network
	snaps *snapshot.Snapshots
}

// Exec runs through the checkpoint feature, which serves checkpoint_before
// and rollback_on_failure and passes every other exec on to the Manager.
func (s pipelineSandboxes) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	return s.snaps.Exec(ctx, id, req)
}

// LookupSandbox implements pipeline.Sandboxes (sandbox.Handle.Sandbox).
func (s pipelineSandboxes) LookupSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	h, err := s.Manager.Handle(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return h.Sandbox(), nil
}

// WatchProcess implements pipeline.Sandboxes (sandbox.Handle.Watch).
func (s pipelineSandboxes) WatchProcess(ctx context.Context, id string, pid int) (execstream.Stream, error) {
	h, err := s.Manager.Handle(ctx, id)
	if err != nil {
		return nil, err
	}
	return h.Watch(ctx, pid)
}

// SandboxStats implements pipeline.Sandboxes (sandbox.Handle.Stats).
func (s pipelineSandboxes) SandboxStats(ctx context.Context, id string) (runtime.Stats, error) {
	h, err := s.Manager.Handle(ctx, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	return h.Stats(ctx)
}

var (
	_ pipeline.Sandboxes    = pipelineSandboxes{}
	_ pipeline.EgressLogger = pipelineSandboxes{}
)

func newPipeline(cfg *config.Config, mgr *sandbox.Manager, network *sandboxnet.Network, snaps *snapshot.Snapshots, st *store.Bolt, log *slog.Logger) (*pipelineAPI, error) {
	p, err := pipeline.New(pipeline.Config{Sandboxes: pipelineSandboxes{mgr, network, snaps}, Store: st, Logger: log, JournalPath: filepath.Join(cfg.DataDir, "runs.journal")})
	if err != nil {
		return nil, err
	}
	key, err := secrets.LoadOrCreateKey(cfg.SecretsKeyFile)
	if err != nil {
		return nil, err
	}
	hooks, err := pipeline.NewHooks(p, key.Derive(hookKeyPurpose))
	if err != nil {
		return nil, err
	}
	return &pipelineAPI{p: p, sched: pipeline.NewScheduler(p), hooks: hooks, log: log}, nil
}

// start reconciles the runs the previous daemon did not see end (the run
// journal), deletes the sandboxes of runs nobody follows any more and
// starts the schedules (applying missed-run policies). It runs after the
// Manager's Recover: those runs' sandboxes must be known.
func (x *pipelineAPI) start(ctx context.Context) error {
	x.p.Recover(ctx)
	x.p.ReapOrphans(ctx)
	if err := x.sched.Start(ctx); err != nil {
		return fmt.Errorf("starting schedules: %w", err)
	}
	return nil
}

// deleteTriggers deletes the schedules and webhooks of the tenant of ctx
// (tenant deletion).
func (x *pipelineAPI) deleteTriggers(ctx context.Context) error {
	scheds, err := x.sched.List(ctx)
	if err != nil {
		return err
	}
	for _, s := range scheds {
		if err := x.sched.Delete(ctx, s.ID); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	hooks, err := x.hooks.List(ctx)
	if err != nil {
		return err
	}
	for _, h := range hooks {
		if err := x.hooks.Delete(ctx, h.ID); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// close stops the scheduler and waits for finished run records still being
// written.
func (x *pipelineAPI) close() {
	if x != nil {
		x.sched.Close()
		if err := x.p.Close(); err != nil {
			x.log.Warn("closing the run journal", "err", err)
		}
	}
}

// Exec is the API trigger of the pipeline (CLI and SDK exec come here
// too): the run's who is the request's caller.
func (s service) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	exe, err := s.pipelineAPI.p.Execute(ctx, pipeline.Run{Trigger: api.TriggerAPI, Who: httpapi.CallerFrom(ctx), SandboxID: id, Exec: req})
	if err != nil {
		return nil, err
	}
	return exe.Stream, nil
}

// StartProcess is Exec in the background.
func (s service) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	req.Background = true
	exe, err := s.pipelineAPI.p.Execute(ctx, pipeline.Run{Trigger: api.TriggerAPI, Who: httpapi.CallerFrom(ctx), SandboxID: id, Exec: req})
	if err != nil {
		return api.Process{}, err
	}
	return exe.Process, nil
}

// ListRuns implements httpapi.RunService.
func (x *pipelineAPI) ListRuns(ctx context.Context, sandbox, trigger string, limit int) ([]api.Run, error) {
	return x.p.List(ctx, store.RunFilter{Sandbox: sandbox, Trigger: trigger, Limit: limit})
}

// GetRun implements httpapi.RunService.
func (x *pipelineAPI) GetRun(ctx context.Context, id string) (api.Run, error) {
	return x.p.Get(ctx, id)
}

// Usage implements httpapi.RunService.
func (x *pipelineAPI) Usage(ctx context.Context, sandbox string, since time.Time) (api.Usage, error) {
	return x.p.Usage(ctx, sandbox, since)
}

// ExportUsage implements httpapi.RunService.
func (x *pipelineAPI) ExportUsage(ctx context.Context, sandbox string, since time.Time, emit func(api.UsageRecord) error) error {
	return x.p.ExportUsage(ctx, sandbox, since, emit)
}

// CreateSchedule implements httpapi.ScheduleService.
func (x *pipelineAPI) CreateSchedule(ctx context.Context, req api.CreateScheduleRequest) (api.Schedule, error) {
	return x.sched.Create(ctx, req)
}

// ListSchedules implements httpapi.ScheduleService.
func (x *pipelineAPI) ListSchedules(ctx context.Context) ([]api.Schedule, error) {
	return x.sched.List(ctx)
}

// GetSchedule implements httpapi.ScheduleService.
func (x *pipelineAPI) GetSchedule(ctx context.Context, id string) (api.Schedule, error) {
	return x.sched.Get(ctx, id)
}

// DeleteSchedule implements httpapi.ScheduleService.
func (x *pipelineAPI) DeleteSchedule(ctx context.Context, id string) error {
	return x.sched.Delete(ctx, id)
}

// TriggerSchedule implements httpapi.ScheduleService.
func (x *pipelineAPI) TriggerSchedule(ctx context.Context, id string) (api.Run, error) {
	return x.sched.Trigger(ctx, id)
}

// CreateHook implements httpapi.HookService.
func (x *pipelineAPI) CreateHook(ctx context.Context, req api.CreateHookRequest) (api.Hook, error) {
	return x.hooks.Create(ctx, req)
}

// ListHooks implements httpapi.HookService.
func (x *pipelineAPI) ListHooks(ctx context.Context) ([]api.Hook, error) {
	return x.hooks.List(ctx)
}

// GetHook implements httpapi.HookService.
func (x *pipelineAPI) GetHook(ctx context.Context, id string) (api.Hook, error) {
	return x.hooks.Get(ctx, id)
}

// DeleteHook implements httpapi.HookService.
func (x *pipelineAPI) DeleteHook(ctx context.Context, id string) error {
	return x.hooks.Delete(ctx, id)
}

// InvokeHook implements httpapi.HookService.
func (x *pipelineAPI) InvokeHook(ctx context.Context, id, timestamp, signature string, body []byte, wait bool) (api.Run, error) {
	return x.hooks.Invoke(ctx, id, timestamp, signature, body, wait)
}
