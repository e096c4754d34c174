package httpapi

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// PoolService is implemented by a Service that keeps warm pools of paused
// sandboxes per template and backend (api/limits.go); its routes exist
// only then. The contract of Service applies.
type PoolService interface {
	// SetPool sets the size of template name's pool on backend runtime
	// ("": the one a create of the template naming none runs on; size 0
	// removes the pool) and returns its state; the pool fills in the
	// background.
	SetPool(ctx context.Context, name, runtime string, size int) (api.Pool, error)
	// Pools lists the pools by template name, then backend.
	Pools(ctx context.Context) ([]api.Pool, error)
}

// poolRoutes are the routes of PoolService, when svc has it.
func (h *handler) poolRoutes() []route {
	ps, ok := h.svc.(PoolService)
	if !ok {
		return nil
	}
	return []route{
		{"PUT", "/v1/templates/{name}/pool", func(w http.ResponseWriter, r *http.Request) error {
			var req api.PoolRequest
			if err := h.decodeJSON(w, r, &req, false); err != nil {
				return err
			}
			p, err := ps.SetPool(r.Context(), r.PathValue("name"), req.Runtime, req.Size)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, p)
			return nil
		}},
		{"GET", "/v1/pools", listAll(ps.Pools, func(l []api.Pool) api.PoolList { return api.PoolList{Pools: l} })},
	}
}
