package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/api"
)

// NetworkService is implemented by a Service with an egress proxy; its
// routes exist only then. The contract of Service applies.
type NetworkService interface {
	// UpdateNetwork replaces a running sandbox's network mode and policy.
	UpdateNetwork(ctx context.Context, id string, spec api.NetworkSpec) (api.Sandbox, error)
	// EgressLog returns up to limit (0: all kept) of a sandbox's newest
	// egress records, oldest first.
	EgressLog(ctx context.Context, id string, limit int) ([]api.EgressRecord, error)
}

// networkRoutes are the routes of NetworkService when svc implements it.
func (h *handler) networkRoutes() []route {
	ns, ok := h.svc.(NetworkService)
	if !ok {
		return nil
	}
	return []route{
		{"PUT", "/v1/sandboxes/{id}/network", func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			var spec api.NetworkSpec
			if err := h.decodeJSON(w, r, &spec, false); err != nil {
				return err
			}
			sb, err := ns.UpdateNetwork(r.Context(), id, spec)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}},
		{"GET", "/v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			limit := 0
			if s := r.URL.Query().Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 0 {
					return errorf("limit must be a non-negative integer")
				}
			}
			recs, err := ns.EgressLog(r.Context(), id, limit)
			if err != nil {
				return err
			}
			if recs == nil {
				recs = []api.EgressRecord{}
			}
			writeJSON(w, http.StatusOK, api.EgressLog{Records: recs})
			return nil
		}},
	}
}
