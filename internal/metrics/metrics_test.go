package metrics_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/metrics"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
)

// scrape serves m's handler once and parses the text with the Prometheus
// text parser.
func scrape(t *testing.T, m *metrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, rec.Body)
	}
	return fams
}

// value is the value of the sample of family name whose labels include
// labels (counter, gauge, or a histogram's count); 0 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, mt := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case mt.Counter != nil:
			sum += mt.GetCounter().GetValue()
		case mt.Gauge != nil:
			sum += mt.GetGauge().GetValue()
		case mt.Histogram != nil:
			sum += float64(mt.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func TestMetricsFollowTheCore(t *testing.T) {
	m := metrics.New(metrics.Config{
		Pools: func(context.Context) ([]api.Pool, error) {
			// Two pools of one template, on two backends: one series each.
			return []api.Pool{{Template: "base", Runtime: "native", Size: 2, Ready: 1, Filling: 1}, {Template: "base", Runtime: "gvisor", Size: 3, Ready: 2}}, nil
		},
	})
	e := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) {
		c.Extensions = append(c.Extensions, m)
	})
	before := scrape(t, m)
	if before["go_goroutines"] == nil || before["process_cpu_seconds_total"] == nil {
		t.Fatal("the Go and process collectors are missing")
	}
	if got := value(before, "agentbox_warm_pool_sandboxes", map[string]string{"template": "base", "backend": "native", "state": "ready"}); got != 1 {
		t.Fatalf("warm pool ready = %v, want 1", got)
	}
	if got := value(before, "agentbox_warm_pool_target_sandboxes", map[string]string{"template": "base", "backend": "gvisor"}); got != 3 {
		t.Fatalf("gvisor warm pool target = %v, want 3", got)
	}

	sb := e.Create(api.CreateSandboxRequest{})
	if r := e.Exec(sb.ID, api.ExecRequest{Command: "true"}); r.Code != 0 {
		t.Fatalf("true exited %d", r.Code)
	}
	if r := e.Exec(sb.ID, api.ExecRequest{Command: "exit 3"}); r.Code != 3 {
		t.Fatalf("exit 3 exited %d", r.Code)
	}
	m.Egress(api.EgressRecord{Kind: "connect", Decision: api.EgressAllowed})
	m.Egress(api.EgressRecord{Kind: "connect", Decision: api.EgressDenied})

	after := scrape(t, m)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"agentbox_operations_total", map[string]string{"operation": "create", "outcome": "ok"}, 1},
		{"agentbox_sandbox_create_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"agentbox_execs_total", map[string]string{"mode": "foreground", "outcome": "ok"}, 1},
		{"agentbox_execs_total", map[string]string{"mode": "foreground", "outcome": "nonzero"}, 1},
		{"agentbox_exec_duration_seconds", nil, 2},
		{"agentbox_egress_decisions_total", map[string]string{"decision": "allowed"}, 1},
		{"agentbox_egress_decisions_total", map[string]string{"decision": "denied"}, 1},
		{"agentbox_sandboxes", map[string]string{"state": api.StateRunning}, 1},
		{"agentbox_sandbox_transitions_total", map[string]string{"to": api.StateRunning}, 1},
	} {
		if got := value(after, c.name, c.labels) - value(before, c.name, c.labels); got != c.want {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// The gauge comes from the core's list: after a restart (a new
	// Manager on the same store recovers the sandbox) it is right at once.
	if err := e.M.Close(); err != nil {
		t.Fatal(err)
	}
	restarted := e.Manager()
	if err := restarted.Recover(sandboxtest.Context(t)); err != nil {
		t.Fatal(err)
	}
	m2 := metrics.New(metrics.Config{})
	if err := m2.Provision(restarted); err != nil {
		t.Fatal(err)
	}
	if got := value(scrape(t, m2), "agentbox_sandboxes", map[string]string{"state": api.StateRunning}); got != 1 {
		t.Fatalf("after a restart: %v running sandboxes, want 1", got)
	}
}

// No label value names a sandbox or a tenant.
func TestMetricsLabelsAreBounded(t *testing.T) {
	m := metrics.New(metrics.Config{})
	e := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) {
		c.Extensions = append(c.Extensions, m)
	})
	sb := e.Create(api.CreateSandboxRequest{Name: "secret-name", Labels: map[string]string{"team": "secret-team"}})
	e.Exec(sb.ID, api.ExecRequest{Command: "echo secret-command"})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, s := range []string{sb.ID, "secret-name", "secret-team", "secret-command"} {
		if strings.Contains(rec.Body.String(), s) {
			t.Errorf("/metrics shows %q", s)
		}
	}
}

// Limit events count by type; a warm pool's fill is not a create.
func TestMetricsLimitEventsAndPoolFills(t *testing.T) {
	m := metrics.New(metrics.Config{})
	ctx := context.Background()
	m.Observe(ctx, sandbox.Op{Kind: sandbox.OpEvent, Sandbox: "sb1", Event: &api.SandboxEvent{Type: api.SandboxEventOOM}})
	m.Observe(ctx, sandbox.Op{Kind: sandbox.OpCreate, Sandbox: "sb2", Hidden: true, Duration: 1})
	m.Observe(ctx, sandbox.Op{Kind: sandbox.OpDelete, Sandbox: "sb2", Hidden: true})
	fams := scrape(t, m)
	if got := value(fams, "agentbox_limit_events_total", map[string]string{"type": "oom"}); got != 1 {
		t.Errorf("oom events = %v, want 1", got)
	}
	if got := value(fams, "agentbox_operations_total", map[string]string{"operation": "pool_fill", "outcome": "ok"}); got != 1 {
		t.Errorf("pool fills = %v, want 1", got)
	}
	for _, op := range []string{"create", "delete"} {
		if got := value(fams, "agentbox_operations_total", map[string]string{"operation": op}); got != 0 {
			t.Errorf("%s of a hidden sandbox counted %v times", op, got)
		}
	}
	if got := value(fams, "agentbox_sandbox_create_duration_seconds", nil); got != 0 {
		t.Errorf("a pool fill was timed as a create")
	}
}
