package api

import "time"

// Service URLs (docs/SERVICE-URLS.md): an exposure makes one port inside a
// sandbox reachable over HTTP (and WebSocket) from outside, through the
// daemon, for whoever holds its token.

// ExposeRequest is the body of POST /v1/sandboxes/{id}/exposures.
type ExposeRequest struct {
	// Port is the TCP port inside the sandbox (1..65535) a service
	// listens on, on 127.0.0.1 or any address.
	Port int `json:"port"`
	// TTLSeconds is how long the exposure and its token live; 0 is
	// DefaultExposeTTL, at most MaxExposeTTL.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// Bounds of ExposeRequest.TTLSeconds.
const (
	DefaultExposeTTL = 24 * time.Hour
	MaxExposeTTL     = 30 * 24 * time.Hour
)

// Exposure is one exposed port. Token, URL and BrowserURL are in the
// answer of the expose call only: lists never repeat a token.
type Exposure struct {
	ID        string    `json:"id"`
	Sandbox   string    `json:"sandbox_id"`
	Port      int       `json:"port"`
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// Path is the path-based address on the daemon's TCP listener:
	// /v1/sandboxes/{id}/ports/{port}/.
	Path string `json:"path"`
	// URL is the service's address: host-based ({port}-{id}.{domain})
	// when the daemon has a service domain, else the path on its public
	// URL; "" when the daemon knows neither.
	URL string `json:"url,omitempty"`
	// Token authenticates requests to the service, as the header
	// ServiceTokenHeader or "Authorization: Bearer <token>".
	Token string `json:"token,omitempty"`
	// BrowserURL is URL with a short-lived signed query parameter
	// (ServiceTokenParam) that the first request exchanges for a cookie
	// scoped to the service and is then redirected without; for a
	// browser. Valid for ServiceLinkTTL (or less when the exposure ends
	// sooner).
	BrowserURL string `json:"browser_url,omitempty"`
}

// ExposureList is the body of GET /v1/exposures.
type ExposureList struct {
	Exposures []Exposure `json:"exposures"`
}

// How a request to a service URL presents its credentials.
const (
	// ServiceTokenHeader carries an exposure's token.
	ServiceTokenHeader = "X-Agentbox-Token"
	// ServiceTokenParam is the query parameter of a browser link.
	ServiceTokenParam = "agentbox_token"
	// ServiceCookie is the cookie a browser link is exchanged for.
	ServiceCookie = "agentbox_service"
	// ServiceLinkTTL bounds the life of a browser link's parameter.
	ServiceLinkTTL = 10 * time.Minute
)
