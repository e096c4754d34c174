package httpapi

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/connlimit"
	"github.com/agentbox/agentbox/internal/tenant"
)

// ExposureService is implemented by a Service that serves service URLs
// (internal/serviceurl); its routes exist only then. The contract of
// Service applies.
type ExposureService interface {
	// Expose makes a port of sandbox id reachable through a service URL
	// and returns the exposure with its token (the only time it is told).
	Expose(ctx context.Context, id string, req api.ExposeRequest) (api.Exposure, error)
	// ListExposures lists the caller's live exposures (of sandbox id
	// only, when not ""), without tokens.
	ListExposures(ctx context.Context, id string) ([]api.Exposure, error)
	// RevokeExposure deletes exposure id; its token stops working.
	RevokeExposure(ctx context.Context, id string) error
	// ExposureLink returns exposure id with a fresh browser link.
	ExposureLink(ctx context.Context, id string) (api.Exposure, error)
}

// ServiceGateway serves the requests addressed to service URLs (host
// {port}-{id}.{domain}, or path /v1/sandboxes/{id}/ports/{port}/...),
// which carry a service token, not an API key.
type ServiceGateway interface {
	// Match reports whether r is addressed to a service URL; such a
	// request goes to ServeService, never to the API's routes.
	Match(r *http.Request) bool
	// ServeService authenticates r by its service token, calls admit with
	// the token's tenant before anything is proxied, and serves r. An
	// error is returned only when nothing was written.
	ServeService(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error
}

// serveService hands a service request to the gateway. It skips the
// API's Host, Origin and API-key checks (a service is meant for browsers
// and any client that holds its token; the token is the credential),
// keeps the request id, log line and panic recovery, and counts the
// connection as authenticated once the token is good (not against the
// API's request rate). The API's own response headers are taken off: the service
// answers with its own.
func (h *handler) serveService(w http.ResponseWriter, r *http.Request) error {
	hdr := w.Header()
	hdr.Del("Cache-Control")
	hdr.Del("X-Content-Type-Options")
	return h.opts.Services.ServeService(w, r, func(p tenant.Principal) error {
		// The connection is an authenticated one from here on (its
		// idle and count limits); the API's per-tenant request rate is
		// not applied: a page served through a service URL fetches its
		// assets in bursts, and the rate guards the API, not the
		// tenant's own service.
		connlimit.MarkAuthenticated(r.Context())
		return nil
	})
}

// exposureRoutes are the routes of ExposureService, when svc has it.
func (h *handler) exposureRoutes() []route {
	es, ok := h.svc.(ExposureService)
	if !ok {
		return nil
	}
	return []route{
		{"POST", "/v1/sandboxes/{id}/exposures", func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			var req api.ExposeRequest
			if err := h.decodeJSON(w, r, &req, false); err != nil {
				return err
			}
			x, err := es.Expose(r.Context(), id, req)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusCreated, x)
			return nil
		}},
		{"GET", "/v1/exposures", func(w http.ResponseWriter, r *http.Request) error {
			id := ""
			if ref := r.URL.Query().Get("sandbox"); ref != "" {
				if !sandboxIDRe.MatchString(ref) {
					return errorf("invalid sandbox id or name %q: want ^[a-z0-9][a-z0-9-]{0,63}$", clip(ref))
				}
				id = resolveSandbox(r, ref)
			}
			l, err := es.ListExposures(r.Context(), id)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, api.ExposureList{Exposures: l})
			return nil
		}},
		{"POST", "/v1/exposures/{exposure}/link", func(w http.ResponseWriter, r *http.Request) error {
			id := r.PathValue("exposure")
			if !exposureIDRe.MatchString(id) {
				return errorf("invalid exposure id %q", clip(id))
			}
			x, err := es.ExposureLink(r.Context(), id)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, x)
			return nil
		}},
		{"DELETE", "/v1/exposures/{exposure}", func(w http.ResponseWriter, r *http.Request) error {
			id := r.PathValue("exposure")
			if !exposureIDRe.MatchString(id) {
				return errorf("invalid exposure id %q", clip(id))
			}
			if err := es.RevokeExposure(r.Context(), id); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		}},
	}
}
