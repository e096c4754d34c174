package agentbox

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Exposure is one exposed port of a sandbox (a service URL). Its Token,
// URL and BrowserURL are set only in the result of Expose.
type Exposure = api.Exposure

// Expose makes port inside the sandbox reachable over HTTP and WebSocket
// through the daemon, for ttl (0: the daemon's default of 24 hours), and
// returns the exposure: send Token as the X-Agentbox-Token header (or
// "Authorization: Bearer") to URL, or open BrowserURL in a browser (its
// signed parameter is good for 10 minutes and becomes a cookie). A
// request to a paused or hibernated sandbox wakes it. Deleting the
// sandbox, or RevokeExposure, ends the token.
func (s *Sandbox) Expose(ctx context.Context, port int, ttl time.Duration) (Exposure, error) {
	var x Exposure
	req := api.ExposeRequest{Port: port, TTLSeconds: int64(ttl / time.Second)}
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/exposures"), json: req}, &x); err != nil {
		return Exposure{}, wrapf(err, "exposing port %d of sandbox %s", port, s.id)
	}
	return x, nil
}

// Exposures lists the sandbox's live exposures (without tokens).
func (s *Sandbox) Exposures(ctx context.Context) ([]Exposure, error) {
	return s.c.listExposures(ctx, s.id)
}

// ListExposures lists the caller's live exposures, of every sandbox
// (without tokens).
func (c *Client) ListExposures(ctx context.Context) ([]Exposure, error) {
	return c.listExposures(ctx, "")
}

func (c *Client) listExposures(ctx context.Context, sandbox string) ([]Exposure, error) {
	var l api.ExposureList
	r := request{method: http.MethodGet, path: "/exposures"}
	if sandbox != "" {
		r.query = url.Values{"sandbox": {sandbox}}
	}
	if err := c.call(ctx, r, &l); err != nil {
		return nil, wrapf(err, "listing exposures")
	}
	return l.Exposures, nil
}

// ExposureLink returns exposure id with a fresh BrowserURL (good for 10
// minutes), for a browser to open after the one Expose returned ran out.
// The token is not repeated.
func (c *Client) ExposureLink(ctx context.Context, id string) (Exposure, error) {
	var x Exposure
	if err := c.call(ctx, request{method: http.MethodPost, path: "/exposures/" + url.PathEscape(id) + "/link"}, &x); err != nil {
		return Exposure{}, wrapf(err, "linking exposure %s", id)
	}
	return x, nil
}

// RevokeExposure ends exposure id: its token stops working at once.
func (c *Client) RevokeExposure(ctx context.Context, id string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/exposures/" + url.PathEscape(id)}, nil); err != nil {
		return wrapf(err, "revoking exposure %s", id)
	}
	return nil
}
