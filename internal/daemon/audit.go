package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/auditotel"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxevents"
	"github.com/agentbox/agentbox/internal/version"
)

// openAudit builds the flight recorder (internal/audit) over
// <data dir>/audit, its heads signed with the key of cfg.AuditKey()
// (created when missing); nil when cfg turns it off.
func openAudit(cfg *config.Config, redactor func(id string) *redact.Redactor, log *slog.Logger) (*audit.Recorder, error) {
	if cfg.AuditDisabled {
		return nil, nil
	}
	key, err := audit.LoadOrCreateKey(cfg.AuditKey())
	if err != nil {
		return nil, err
	}
	st, err := audit.OpenStore(filepath.Join(cfg.DataDir, "audit"), key, audit.Limits{
		MaxBytes:  cfg.AuditMaxBytes,
		Retention: time.Duration(cfg.AuditRetentionSeconds) * time.Second,
	}, log)
	if err != nil {
		return nil, err
	}
	// The change tracker's directory sits beside the sandboxes' writable
	// layers, on their filesystem and mount (not a sandbox id: recovery
	// leaves it alone).
	acfg := audit.Config{Store: st, Redactor: redactor, Logger: log, TrackFrom: cfg.AuditTrackFrom}
	if !cfg.AuditWalk {
		acfg.TrackDir = filepath.Join(cfg.DataDir, "sandboxes", ".audit-track")
	}
	if cfg.OTLPEndpoint != "" {
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(cfg.OTLPEndpoint))
		if err != nil {
			return nil, fmt.Errorf("OTLP exporter: %w", err)
		}
		acfg.Sinks = append(acfg.Sinks, auditotel.New(exp, version.Version, false))
	}
	return audit.New(acfg), nil
}

// auditAPI serves the events API (httpapi.AuditService) from the flight
// recorder, or, when it is off, from the bridge's event buffer (no
// follow, no verify).
type auditAPI struct {
	rec    *audit.Recorder
	bridge *sandboxevents.Recorder
}

var errAuditOff = fmt.Errorf("the flight recorder is off (agentbox serve --no-audit): %w", errdefs.ErrFailedPrecondition)

func (a auditAPI) AuditEvents(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error) {
	if a.rec != nil {
		return a.rec.Events(ctx, id, q)
	}
	evs, err := a.bridge.SandboxEvents(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []api.SandboxEvent{}
	for _, ev := range evs {
		if q.Match(ev) && (q.Limit == 0 || len(out) < q.Limit) {
			out = append(out, ev)
		}
	}
	return out, nil
}

func (a auditAPI) FollowAuditEvents(ctx context.Context, id string, q api.EventQuery, ready func(), fn func(api.SandboxEvent) error) error {
	if a.rec == nil {
		return errAuditOff
	}
	return a.rec.Follow(ctx, id, q, ready, fn)
}

func (a auditAPI) VerifyAudit(ctx context.Context, id string) (api.AuditVerifyResult, error) {
	if a.rec == nil {
		return api.AuditVerifyResult{}, errAuditOff
	}
	return a.rec.Verify(ctx, id)
}

func (a auditAPI) VerifyAllAudit(ctx context.Context) ([]api.AuditVerifyResult, error) {
	if a.rec == nil {
		return nil, errAuditOff
	}
	return a.rec.VerifyAll(ctx)
}

// extensions lists the core's extensions: the flight recorder (when on)
// first, then the others in their order.
func extensions(rec *audit.Recorder, others ...sandbox.Extension) []sandbox.Extension {
	if rec == nil {
		return others
	}
	return append([]sandbox.Extension{rec}, others...)
}
