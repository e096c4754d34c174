package test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// scrapeMetrics reads GET /metrics over the unix socket and parses it with
// the Prometheus text parser.
func scrapeMetrics(t *testing.T, d *daemon) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := d.rawRequest(t, "GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return parseMetrics(t, body)
}

func parseMetrics(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// metricValue sums the samples of family name whose labels include labels
// (a histogram's sample count); 0 when there are none.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// A workload moves the counters and histograms of /metrics by exactly what
// it did, and the sandboxes gauge follows the sandboxes, also after a
// daemon restart.
func TestMetricsFollowWorkload(t *testing.T) {
	dir := t.TempDir()
	up := startUpstreams(t, dir)
	hp := strconv.Itoa(up.httpPort)
	d := newDaemon(t)
	before := scrapeMetrics(t, d)
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "agentbox_store_bytes"} {
		if before[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}

	sb := d.create(t, agentbox.SandboxSpec{Network: &api.NetworkSpec{
		Mode:  api.NetworkEgress,
		Allow: []string{"good.test:" + hp},
	}})
	mustRun(t, sb, "true")
	if res := run(t, sb, "exit 3"); res.ExitCode != 3 {
		t.Fatalf("exit 3: exit %d", res.ExitCode)
	}
	if out := mustRun(t, sb, "wget -q -O - http://good.test:"+hp+"/plain"); !strings.Contains(out, "hello from good.test") {
		t.Fatalf("allowed egress: %q", out)
	}
	if res := run(t, sb, "wget -q -O - http://denied.test:"+hp+"/"); res.ExitCode == 0 {
		t.Fatal("a denied destination was reached")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ck, err := sb.Checkpoint(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	forks, err := d.client.Fork(ctx, ck.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	mid := scrapeMetrics(t, d)
	if got := metricValue(mid, "agentbox_sandboxes", map[string]string{"state": api.StateRunning}); got != 2 {
		t.Errorf("running sandboxes = %v, want 2", got)
	}
	if err := forks[0].Delete(ctx); err != nil {
		t.Fatal(err)
	}
	after := scrapeMetrics(t, d)

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"agentbox_operations_total", map[string]string{"operation": "create", "outcome": "ok"}, 2}, // the sandbox and its fork
		{"agentbox_sandbox_create_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"agentbox_execs_total", map[string]string{"mode": "foreground", "outcome": "ok"}, 2},
		{"agentbox_execs_total", map[string]string{"mode": "foreground", "outcome": "nonzero"}, 2},
		{"agentbox_exec_duration_seconds", nil, 4},
		{"agentbox_operations_total", map[string]string{"operation": "checkpoint", "outcome": "ok"}, 1},
		{"agentbox_checkpoint_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"agentbox_operations_total", map[string]string{"operation": "restore", "outcome": "ok"}, 1},
		{"agentbox_restore_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"agentbox_operations_total", map[string]string{"operation": "fork", "outcome": "ok"}, 1},
		{"agentbox_fork_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"agentbox_operations_total", map[string]string{"operation": "delete", "outcome": "ok"}, 1},
		{"agentbox_egress_decisions_total", map[string]string{"decision": api.EgressAllowed}, 1},
		{"agentbox_egress_decisions_total", map[string]string{"decision": api.EgressDenied}, 1},
		{"agentbox_sandboxes", map[string]string{"state": api.StateRunning}, 1},
	} {
		if got := metricValue(after, c.name, c.labels) - metricValue(before, c.name, c.labels); got != c.want {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// No label value names a sandbox.
	_, body := d.rawRequest(t, "GET", "/metrics", nil)
	if bytes.Contains(body, []byte(sb.ID())) {
		t.Error("/metrics names a sandbox")
	}

	// The gauge is computed from the recovered sandboxes after a restart.
	d.restart(syscall.SIGTERM)
	if got := metricValue(scrapeMetrics(t, d), "agentbox_sandboxes", nil); got != 1 {
		t.Errorf("after a restart: %v sandboxes, want 1", got)
	}
}

// /healthz and /readyz answer without credentials on TCP; /metrics needs
// an admin key there, and none on the dedicated metrics listener.
func TestHealthAndMetricsAccess(t *testing.T) {
	addr := loopbackAddr(t)
	maddr := loopbackAddr(t)
	keyFile := filepath.Join(t.TempDir(), "keys")
	key := "test-key-" + randHex(16)
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemonWith(t, "--tcp", addr, "--api-keys-file", keyFile, "--metrics-addr", maddr)
	get := func(url, key string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.Bytes()
	}
	status := func(body []byte) string {
		var v struct{ Status string }
		_ = json.Unmarshal(body, &v)
		return v.Status
	}
	for _, base := range []string{"http://" + addr, "http://" + maddr} {
		if code, body := get(base+"/healthz", ""); code != 200 || status(body) != "ok" {
			t.Errorf("%s/healthz: %d %s", base, code, body)
		}
		if code, body := get(base+"/readyz", ""); code != 200 || status(body) != "ready" {
			t.Errorf("%s/readyz: %d %s", base, code, body)
		}
	}
	if code, body := d.rawRequest(t, "GET", "/readyz", nil); code != 200 || status(body) != "ready" {
		t.Errorf("unix /readyz: %d %s", code, body)
	}
	if code, _ := get("http://"+addr+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("TCP /metrics without a key: %d, want 401", code)
	}
	code, body := get("http://"+addr+"/metrics", key)
	if code != 200 {
		t.Fatalf("TCP /metrics with the admin key: %d %s", code, body)
	}
	parseMetrics(t, body)
	code, body = get("http://"+maddr+"/metrics", "")
	if code != 200 {
		t.Fatalf("metrics listener /metrics: %d %s", code, body)
	}
	if parseMetrics(t, body)["agentbox_operations_total"] == nil && parseMetrics(t, body)["go_goroutines"] == nil {
		t.Error("metrics listener serves no metrics")
	}
	// The metrics listener serves nothing else.
	if code, _ := get("http://"+maddr+"/v1/sandboxes", ""); code != http.StatusNotFound {
		t.Errorf("metrics listener /v1/sandboxes: %d, want 404", code)
	}
}
