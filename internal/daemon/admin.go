package daemon

import (
	"context"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/httpapi"
)

// The store's quarantine of corrupt records (set aside by the core's
// Recover) reaches the HTTP edge through the service adapter.
var _ httpapi.QuarantineService = service{}

// Quarantine implements httpapi.QuarantineService: the records set aside
// as corrupt at start-up (none when the store cannot quarantine).
func (s service) Quarantine(ctx context.Context) ([]api.QuarantinedRecord, error) {
	out := []api.QuarantinedRecord{}
	if s.records == nil {
		return out, nil
	}
	recs, err := s.records.ListQuarantine(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		out = append(out, api.QuarantinedRecord{Bucket: r.Bucket, Key: r.Key, Reason: r.Reason, Raw: r.Raw, At: r.At})
	}
	return out, nil
}
