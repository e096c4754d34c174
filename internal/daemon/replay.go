package daemon

import (
	"context"
	"log/slog"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/pipeline"
	"github.com/agentbox/agentbox/internal/replay"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/snapshot"
)

// replayAPI serves replay, compare and run reports (httpapi.ReplayService)
// from internal/replay, which reads the flight recorder: with the
// recorder off (serve --no-audit) they are refused.
type replayAPI struct {
	r *replay.Replayer
}

var _ httpapi.ReplayService = service{}

// newReplay builds the replayer over the flight recorder (nil: none), the
// checkpoint feature and the execution pipeline, whose runs it starts with
// trigger "replay".
func newReplay(rec *audit.Recorder, snaps *snapshot.Snapshots, pipe *pipelineAPI, mgr *sandbox.Manager, log *slog.Logger) replayAPI {
	if rec == nil {
		return replayAPI{}
	}
	return replayAPI{replay.New(rec, snaps, replayRunner{pipe.p}, mgr, log)}
}

// replayRunner runs a replay's steps through the one execute path.
type replayRunner struct{ p *pipeline.Pipeline }

func (x replayRunner) RunReplay(ctx context.Context, id string, req api.ExecRequest) (string, execstream.Stream, error) {
	exe, err := x.p.Execute(ctx, pipeline.Run{Trigger: api.TriggerReplay, Who: httpapi.CallerFrom(ctx), SandboxID: id, Exec: req})
	if err != nil {
		return "", nil, err
	}
	return exe.ID, exe.Stream, nil
}

func (a replayAPI) Replay(ctx context.Context, id string, req api.ReplayRequest) (api.ReplayResult, error) {
	if a.r == nil {
		return api.ReplayResult{}, errAuditOff
	}
	return a.r.Replay(ctx, id, req)
}

func (a replayAPI) Compare(ctx context.Context, x, y string) (api.CompareResult, error) {
	if a.r == nil {
		return api.CompareResult{}, errAuditOff
	}
	return a.r.Compare(ctx, x, y)
}

func (a replayAPI) RunReport(ctx context.Context, id, run string) (api.RunSummary, error) {
	if a.r == nil {
		return api.RunSummary{}, errAuditOff
	}
	return a.r.Report(ctx, id, run)
}
