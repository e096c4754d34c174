package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// /healthz and /readyz need no key on TCP and tell nothing but their
// status; /readyz is 503 with the reason when the daemon is not ready;
// /metrics is the admin tenant's on TCP, everyone's on the unix socket.
func TestProbesAndMetricsAccess(t *testing.T) {
	reg, full, _ := newRegistry(t)
	const adminKey = "k-0123456789abcdef"
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("agentbox_up 1\n")) })
	var notReady error
	ready := func(context.Context) error { return notReady }
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{adminKey}, Tenants: reg, Metrics: metrics, Ready: ready})

	rec := do(h, "GET", "/healthz", "")
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"status":"ok"}` || rec.Header().Get(api.VersionHeader) != "" {
		t.Fatalf("anonymous /healthz: %d %q version %q", rec.Code, rec.Body, rec.Header().Get(api.VersionHeader))
	}
	if rec := do(h, "GET", "/readyz", ""); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"status":"ready"}` {
		t.Fatalf("anonymous /readyz: %d %q", rec.Code, rec.Body)
	}
	notReady = errors.New("shutting down")
	if rec := do(h, "GET", "/readyz", ""); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "shutting down") {
		t.Fatalf("/readyz not ready: %d %q", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/readyz", "", "Authorization", "Bearer "+adminKey); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz not ready, with a key: %d %q", rec.Code, rec.Body)
	}
	notReady = nil

	if rec := do(h, "GET", "/metrics", ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("/metrics without a key: %d, want 401", rec.Code)
	}
	if rec := do(h, "GET", "/metrics", "", "Authorization", "Bearer "+full.Key); rec.Code != http.StatusForbidden {
		t.Errorf("/metrics with a tenant's key: %d, want 403", rec.Code)
	}
	if rec := do(h, "GET", "/metrics", "", "Authorization", "Bearer "+adminKey); rec.Code != 200 || rec.Body.String() != "agentbox_up 1\n" {
		t.Errorf("/metrics with the admin key: %d %q", rec.Code, rec.Body)
	}
	hu, _ := newTestHandler(t, &fakeService{}, Options{Metrics: metrics})
	if rec := do(hu, "GET", "/metrics", ""); rec.Code != 200 {
		t.Errorf("unix /metrics: %d", rec.Code)
	}
	hn, _ := newTestHandler(t, &fakeService{}, Options{})
	if rec := do(hn, "GET", "/metrics", ""); rec.Code != http.StatusNotFound {
		t.Errorf("/metrics without metrics: %d, want 404", rec.Code)
	}

	// The metrics listener serves the probes and /metrics without a key,
	// and nothing else.
	p := ProbeHandler(Options{Metrics: metrics, Ready: ready})
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if rec := do(p, "GET", path, ""); rec.Code != 200 {
			t.Errorf("probe listener %s: %d", path, rec.Code)
		}
	}
	if rec := do(p, "GET", "/v1/sandboxes", ""); rec.Code != http.StatusNotFound {
		t.Errorf("probe listener /v1/sandboxes: %d, want 404", rec.Code)
	}
}
