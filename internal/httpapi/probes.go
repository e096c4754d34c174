package httpapi

import (
	"fmt"
	"net/http"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Probes and metrics: GET /healthz (liveness), GET /readyz (readiness) and
// GET /metrics (Prometheus text). The probes need no credentials on any
// listener; /metrics is served as every other route (on TCP: an admin
// key), and a dedicated metrics listener (daemon setting metrics_addr)
// serves it without one. See docs/METRICS.md.

func (h *handler) probeRoutes() []route {
	return []route{
		{"GET", "/healthz", h.healthz},
		{"GET", "/readyz", h.readyz},
		{"GET", "/metrics", h.metrics},
	}
}

// isProbe reports whether r is an anonymous probe: served without
// credentials on TCP (see checkAccess).
func isProbe(r *http.Request) bool {
	if r.Method != http.MethodGet || r.Header.Get("Authorization") != "" {
		return false
	}
	switch r.URL.Path {
	case "/v1/health", "/healthz", "/readyz":
		return true
	}
	return false
}

// healthz answers 200 {"status":"ok"} while the daemon serves requests: it
// checks nothing else (liveness).
func (h *handler) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// readyz answers 200 {"status":"ready"} when the daemon can create
// sandboxes (Options.Ready returns nil) and 503 with the reason otherwise.
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Ready != nil {
		if err := h.opts.Ready(r.Context()); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return nil
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

// metrics serves Options.Metrics; 404 when the daemon has none.
func (h *handler) metrics(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Metrics == nil {
		return fmt.Errorf("metrics are not served by this daemon: %w", errdefs.ErrNotFound)
	}
	h.opts.Metrics.ServeHTTP(w, r)
	return nil
}

// ProbeHandler serves only /healthz, /readyz and /metrics, without
// credentials: the handler of the dedicated metrics listener, for a
// scraper on a port of its own (typically bound to loopback or a
// management network).
func ProbeHandler(opts Options) http.Handler {
	h := &handler{opts: opts}
	mux := http.NewServeMux()
	for _, rt := range h.probeRoutes() {
		mux.HandleFunc(rt.method+" "+rt.pattern, handle(rt.fn))
	}
	return mux
}
