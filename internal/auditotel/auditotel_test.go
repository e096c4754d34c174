package auditotel

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agentbox/agentbox/api"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func workload() []api.SandboxEvent {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	exit0 := 0
	return []api.SandboxEvent{
		{Seq: 1, Time: t0, SandboxID: "sb1", Type: api.EventTransition, Cause: "create", Transition: &api.Transition{From: "creating", To: "running", Cause: "create"}},
		{Seq: 2, Time: t0.Add(time.Second), SandboxID: "sb1", RunID: "run_a", Type: api.EventRunStarted, Run: &api.RunEvent{Command: "pip install x", Mode: "foreground", TraceParent: parent}},
		{Seq: 3, Time: t0.Add(2 * time.Second), SandboxID: "sb1", RunID: "run_a", Type: api.EventNetwork, Egress: &api.EgressRecord{Destination: "pypi.org:443", Decision: api.EgressAllowed}},
		{Seq: 4, Time: t0.Add(3 * time.Second), SandboxID: "sb1", RunID: "run_a", Type: api.EventFileChanged, File: &api.FileEvent{Path: "/root/x.py", Change: api.FileCreated}},
		{Seq: 5, Time: t0.Add(3 * time.Second), SandboxID: "sb1", RunID: "run_a", Type: api.EventPackage, Package: &api.PackageEvent{Manager: "pip", Name: "x", Version: "1.0", Action: "installed"}},
		{Seq: 6, Time: t0.Add(3 * time.Second), SandboxID: "sb1", RunID: "run_a", Type: api.EventRunEnded, Run: &api.RunEvent{Outcome: "ok", ExitCode: &exit0}},
		{Seq: 7, Time: t0.Add(4 * time.Second), SandboxID: "sb1", Type: api.EventCheckpoint, Detail: "cp1"},
	}
}

// A run is a span, child of the caller's traceparent, with its network,
// file and package events as span events; other events are spans of
// their own.
func TestRunIsASpan(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	x := New(mem, "test", true)
	for _, ev := range workload() {
		x.Event(ev)
	}
	spans := mem.GetSpans() // the in-memory exporter forgets them at Close
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	names := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		names[s.Name] = s
	}
	if len(spans) != 3 || names["run"].Name == "" || names[api.EventTransition].Name == "" || names[api.EventCheckpoint].Name == "" {
		t.Fatalf("spans: %+v", spans)
	}
	run := names["run"]
	if got := run.SpanContext.TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("run span's trace %s, want the caller's", got)
	}
	if got := run.Parent.SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("run span's parent %s, want the caller's span", got)
	}
	var evNames []string
	for _, e := range run.Events {
		evNames = append(evNames, e.Name)
	}
	if len(evNames) != 3 || evNames[0] != api.EventNetwork || evNames[1] != api.EventFileChanged || evNames[2] != api.EventPackage {
		t.Errorf("run span's events %v", evNames)
	}
	if d := run.EndTime.Sub(run.StartTime); d != 2*time.Second {
		t.Errorf("run span lasted %v, want 2s", d)
	}
}

// The OTLP/HTTP exporter delivers the spans to a receiver on loopback.
func TestOTLPExport(t *testing.T) {
	got := make(chan *coltracepb.ExportTraceServiceRequest, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		got <- &req
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	defer srv.Close()
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	x := New(exp, "test", false)
	for _, ev := range workload() {
		x.Event(ev)
	}
	if err := x.Close(ctx); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		select {
		case req := <-got:
			for _, rs := range req.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					n += len(ss.Spans)
				}
			}
			continue
		default:
		}
		break
	}
	if n != 3 {
		t.Fatalf("the receiver got %d spans, want 3", n)
	}
}
