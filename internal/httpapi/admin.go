package httpapi

import (
	"context"

	"github.com/agentbox/agentbox/api"
)

// QuarantineService is implemented by a Service that sets corrupt store
// records aside at start-up instead of failing; GET /v1/admin/quarantine
// exists only then. The contract of Service applies.
type QuarantineService interface {
	// Quarantine returns every record set aside as corrupt, oldest first
	// (an empty list when there is none).
	Quarantine(ctx context.Context) ([]api.QuarantinedRecord, error)
}

// adminRoutes are the routes of QuarantineService, when svc has it.
func (h *handler) adminRoutes() []route {
	qs, ok := h.svc.(QuarantineService)
	if !ok {
		return nil
	}
	return []route{
		{"GET", "/v1/admin/quarantine", listAll(qs.Quarantine, func(l []api.QuarantinedRecord) []api.QuarantinedRecord { return l })},
	}
}
