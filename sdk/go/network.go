package agentbox

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/api"
)

// NetworkSpec is a sandbox's network mode and egress policy (see
// api.NetworkSpec); set it in SandboxSpec.Network at create or with
// SetNetwork later.
type NetworkSpec = api.NetworkSpec

// SetNetwork replaces the sandbox's network mode and egress policy.
func (s *Sandbox) SetNetwork(ctx context.Context, spec NetworkSpec) error {
	var info api.Sandbox
	if err := s.c.call(ctx, request{method: http.MethodPut, path: s.path("/network"), json: spec}, &info); err != nil {
		return wrapf(err, "setting network of sandbox %s", s.id)
	}
	s.mu.Lock()
	s.info = info
	s.mu.Unlock()
	return nil
}

// EgressLog returns up to limit (0: all kept) of the sandbox's newest
// egress records, oldest first.
func (s *Sandbox) EgressLog(ctx context.Context, limit int) ([]api.EgressRecord, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.EgressLog
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/egress"), query: q}, &out); err != nil {
		return nil, wrapf(err, "reading egress log of sandbox %s", s.id)
	}
	return out.Records, nil
}
