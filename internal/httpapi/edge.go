package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/agentbox/agentbox/internal/connlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// errAnonymousHealth is checkAccess's answer to a probe (GET /v1/health,
// /healthz, /readyz; see isProbe) without credentials on TCP: it is served
// its status and nothing else (no version header), so load balancers can
// probe the daemon without a key and learn nothing from it.
var errAnonymousHealth = errors.New("anonymous health check")

// admitAuthenticated is the TCP listener's step after a request
// authenticated as p: its connection stops counting as unauthenticated
// (see internal/connlimit), and p's request rate is checked.
func (h *handler) admitAuthenticated(r *http.Request, p tenant.Principal) error {
	connlimit.MarkAuthenticated(r.Context())
	if h.opts.RateLimit == nil {
		return nil
	}
	// One bucket per tenant, shared by all its keys (the admin keys of
	// the keys file and admin-tenant keys share "admin").
	if after, ok := h.opts.RateLimit.Allow(p.Tenant); !ok {
		return errdefs.WithRetryAfter(fmt.Errorf("tenant %s is over its request rate: %w", p.Tenant, errdefs.ErrResourceExhausted), after)
	}
	return nil
}
