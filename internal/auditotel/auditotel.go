// Package auditotel exports the flight recorder's events (internal/audit)
// as OpenTelemetry traces: a run is a span (from run.started to run.ended,
// the child of the caller's W3C traceparent when the exec request carried
// one), the files, packages, network decisions and bridge events of the
// run are its span events, and every other event (transitions,
// checkpoints, restores, forks, network decisions outside a run) is a
// span of its own, without duration. See docs/AUDIT.md.
//
// It is an audit.Sink; the daemon builds it over an OTLP/HTTP exporter
// when serve --otlp-endpoint is set, tests over an in-memory one.
package auditotel

import (
	"context"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/audit"
)

// maxOpenRuns bounds the spans kept open (runs whose end was never
// recorded, e.g. across a daemon restart): beyond it the oldest is ended.
const maxOpenRuns = 10_000

// Exporter is the sink. Its methods are safe for concurrent use.
type Exporter struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer

	// mu guards runs and order.
	mu    sync.Mutex
	runs  map[string]trace.Span // open run spans by run id
	order []string              // run ids, oldest first
}

var _ audit.Sink = (*Exporter)(nil)

// New returns an exporter sending spans to exp. sync sends each span as
// it ends (tests); otherwise spans are batched.
func New(exp sdktrace.SpanExporter, version string, sync bool) *Exporter {
	opt := sdktrace.WithBatcher(exp)
	if sync {
		opt = sdktrace.WithSyncer(exp)
	}
	res := sdkresource.NewSchemaless(attribute.String("service.name", "agentbox"), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(opt, sdktrace.WithResource(res))
	return &Exporter{tp: tp, tracer: tp.Tracer("github.com/agentbox/agentbox/internal/audit"), runs: map[string]trace.Span{}}
}

// Close ends the open spans and flushes and stops the exporter.
func (x *Exporter) Close(ctx context.Context) error {
	x.mu.Lock()
	for _, id := range x.order {
		if s := x.runs[id]; s != nil {
			s.End()
		}
	}
	x.runs, x.order = map[string]trace.Span{}, nil
	x.mu.Unlock()
	return x.tp.Shutdown(ctx)
}

func common(ev api.SandboxEvent) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String("agentbox.sandbox.id", ev.SandboxID),
		attribute.Int64("agentbox.event.seq", int64(ev.Seq)),
	}
	if ev.Tenant != "" {
		kv = append(kv, attribute.String("agentbox.tenant", ev.Tenant))
	}
	if ev.Actor != "" {
		kv = append(kv, attribute.String("agentbox.actor", ev.Actor))
	}
	if ev.RunID != "" {
		kv = append(kv, attribute.String("agentbox.run.id", ev.RunID))
	}
	return kv
}

// Event implements audit.Sink.
func (x *Exporter) Event(ev api.SandboxEvent) {
	switch {
	case ev.Type == api.EventRunStarted && ev.Run != nil:
		x.startRun(ev)
	case ev.Type == api.EventRunEnded && ev.Run != nil:
		x.endRun(ev)
	default:
		if ev.RunID != "" && x.addToRun(ev) {
			return
		}
		_, s := x.tracer.Start(context.Background(), ev.Type, trace.WithTimestamp(ev.Time),
			trace.WithAttributes(append(common(ev), details(ev)...)...))
		if ev.Error != "" {
			s.SetStatus(codes.Error, ev.Error)
		}
		s.End(trace.WithTimestamp(ev.Time))
	}
}

func (x *Exporter) startRun(ev api.SandboxEvent) {
	ctx := context.Background()
	if tp := ev.Run.TraceParent; tp != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
	}
	kv := append(common(ev),
		attribute.String("agentbox.run.command", ev.Run.Command),
		attribute.String("agentbox.run.mode", ev.Run.Mode))
	if ev.Run.Cwd != "" {
		kv = append(kv, attribute.String("agentbox.run.cwd", ev.Run.Cwd))
	}
	if ev.Run.User != "" {
		kv = append(kv, attribute.String("agentbox.run.user", ev.Run.User))
	}
	if len(ev.Run.Credentials) > 0 {
		kv = append(kv, attribute.StringSlice("agentbox.run.credentials", ev.Run.Credentials))
	}
	_, s := x.tracer.Start(ctx, "run", trace.WithTimestamp(ev.Time), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(kv...))
	if ev.Run.Mode == "background" {
		// Nothing follows a background process to its end.
		s.End(trace.WithTimestamp(ev.Time))
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.runs[ev.RunID] = s
	x.order = append(x.order, ev.RunID)
	for len(x.order) > maxOpenRuns {
		if old := x.runs[x.order[0]]; old != nil {
			old.End()
			delete(x.runs, x.order[0])
		}
		x.order = x.order[1:]
	}
}

func (x *Exporter) endRun(ev api.SandboxEvent) {
	x.mu.Lock()
	s := x.runs[ev.RunID]
	delete(x.runs, ev.RunID)
	for i, id := range x.order {
		if id == ev.RunID {
			x.order = append(x.order[:i], x.order[i+1:]...)
			break
		}
	}
	x.mu.Unlock()
	if s == nil {
		return
	}
	r := ev.Run
	kv := []attribute.KeyValue{
		attribute.String("agentbox.run.outcome", r.Outcome),
		attribute.Int64("agentbox.run.output_bytes", r.OutputBytes),
		attribute.String("agentbox.run.output_sha256", r.OutputSHA256),
	}
	if r.ExitCode != nil {
		kv = append(kv, attribute.Int("agentbox.run.exit_code", *r.ExitCode))
	}
	if r.Signal != "" {
		kv = append(kv, attribute.String("agentbox.run.signal", r.Signal))
	}
	s.SetAttributes(kv...)
	if r.Outcome != "ok" {
		s.SetStatus(codes.Error, r.Outcome)
	}
	s.End(trace.WithTimestamp(ev.Time))
}

// addToRun adds ev to its run's open span as a span event.
func (x *Exporter) addToRun(ev api.SandboxEvent) bool {
	x.mu.Lock()
	s := x.runs[ev.RunID]
	x.mu.Unlock()
	if s == nil {
		return false
	}
	s.AddEvent(ev.Type, trace.WithTimestamp(ev.Time), trace.WithAttributes(append([]attribute.KeyValue{
		attribute.Int64("agentbox.event.seq", int64(ev.Seq))}, details(ev)...)...))
	return true
}

// details are the attributes of ev's structured part.
func details(ev api.SandboxEvent) []attribute.KeyValue {
	var kv []attribute.KeyValue
	add := func(k, v string) {
		if v != "" {
			kv = append(kv, attribute.String(k, v))
		}
	}
	switch {
	case ev.File != nil:
		add("agentbox.file.path", ev.File.Path)
		add("agentbox.file.change", ev.File.Change)
		add("agentbox.file.kind", ev.File.Kind)
		add("agentbox.file.sha256", ev.File.SHA256)
		if ev.File.Size > 0 {
			kv = append(kv, attribute.Int64("agentbox.file.size", ev.File.Size))
		}
	case ev.Package != nil:
		add("agentbox.package.manager", ev.Package.Manager)
		add("agentbox.package.name", ev.Package.Name)
		add("agentbox.package.version", ev.Package.Version)
		add("agentbox.package.action", ev.Package.Action)
	case ev.Egress != nil:
		add("agentbox.egress.destination", ev.Egress.Destination)
		add("agentbox.egress.decision", ev.Egress.Decision)
		add("agentbox.egress.kind", ev.Egress.Kind)
		add("agentbox.egress.rule", ev.Egress.Rule)
		add("http.request.method", ev.Egress.Method)
		if ev.Egress.Status > 0 {
			kv = append(kv, attribute.Int("http.response.status_code", ev.Egress.Status))
		}
	case ev.Transition != nil:
		add("agentbox.transition.from", ev.Transition.From)
		add("agentbox.transition.to", ev.Transition.To)
		add("agentbox.transition.cause", ev.Transition.Cause)
	case ev.Dropped != nil:
		add("agentbox.dropped.count", strconv.FormatInt(ev.Dropped.Count, 10))
	default:
		add("agentbox.detail", ev.Detail)
		add("agentbox.message", ev.Message)
		add("agentbox.metric.name", ev.Name)
	}
	add("agentbox.error", ev.Error)
	return kv
}
