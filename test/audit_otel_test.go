package test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestFlightRecorderOTLP: with serve --otlp-endpoint, an exec made with a
// caller's traceparent reaches an OTLP/HTTP receiver on loopback as a
// "run" span that is the child of the caller's span, its file changes as
// span events.
func TestFlightRecorderOTLP(t *testing.T) {
	var mu sync.Mutex
	var spans []*tracepb.Span
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	d := newDaemonWith(t, "--otlp-endpoint", srv.URL+"/v1/traces")
	sb := d.create(t, agentbox.SandboxSpec{})
	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Run(agentbox.WithTraceParent(ctx, "00-"+traceID+"-"+spanID+"-01"), "echo traced > /root/traced.txt")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %+v %v", res, err)
	}
	var run *tracepb.Span
	for deadline := time.Now().Add(30 * time.Second); run == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		mu.Lock()
		for _, s := range spans {
			if s.Name == "run" && hex.EncodeToString(s.TraceId) == traceID {
				run = s
			}
		}
		mu.Unlock()
	}
	if run == nil {
		t.Fatal("no run span of the caller's trace reached the receiver in 30s")
	}
	if got := hex.EncodeToString(run.ParentSpanId); got != spanID {
		t.Errorf("run span's parent %s, want the caller's %s", got, spanID)
	}
	found := false
	for _, e := range run.Events {
		for _, a := range e.Attributes {
			if e.Name == "file.changed" && a.Key == "agentbox.file.path" && a.Value.GetStringValue() == "/root/traced.txt" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("the run span lacks its file change: %+v", run.Events)
	}
}
