package e2b

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Ports of a sandbox as E2B's SDK addresses them (E2b-Sandbox-Port).
const (
	// EnvdPort is envd's port: served by this package.
	EnvdPort = 49983
	// CodeInterpreterPort is the code interpreter's; served by the
	// PortHandler registered for it, if any.
	CodeInterpreterPort = 49999
)

// EnvdVersion is the envd version reported to the SDK, which enables its
// features by version: >= 0.4.0 sends no user by default (we default to
// DefaultUser), >= 0.5.2 closes stdin, >= 0.5.7 uploads octet-stream.
// File metadata (0.6.2) and watch entries (0.6.3) are not supported, so
// it stays below those.
const EnvdVersion = "0.5.7"

// DefaultUser is the user commands and file paths default to, with home
// and working directory DefaultHome, as on E2B.
const (
	DefaultUser = "user"
	DefaultHome = "/home/user"
)

// DefaultTemplates maps E2B's template names to agentbox templates.
var DefaultTemplates = map[string]string{
	"base":                "debian",
	"code-interpreter-v1": "code-interpreter",
}

// Labels of a sandbox made through this front end.
const (
	// LabelTemplate is the template id the E2B caller asked for.
	LabelTemplate = "e2b.template"
	// MetadataPrefix prefixes every metadata key in the labels.
	MetadataPrefix = "e2b.metadata/"
	// LabelAutoPause marks a sandbox created with autoPause.
	LabelAutoPause = "e2b.autopause"
	// LabelSnapshot marks a checkpoint taken as an E2B snapshot.
	LabelSnapshot = "e2b.snapshot"
)

// PortHandler serves the traffic E2B's SDK sends to a sandbox port other
// than envd's (E2b-Sandbox-Port, or the {port}-{id}.{domain} host), for
// the sandbox id, after the request's access token (envd's, or the
// traffic token) was checked and removed from the request, with ctx
// carrying the sandbox owner's principal. It returns an error only when
// it wrote nothing; the server answers it as an E2B error (a sandbox the
// principal cannot see is errdefs.ErrNotFound).
type PortHandler interface {
	ServeSandboxPort(w http.ResponseWriter, r *http.Request, sandboxID string) error
}

// HostRouter is host-based addressing of sandboxes, as E2B's SDK uses it
// without E2B_SANDBOX_URL: {port}-{sandbox id}.{domain}.
type HostRouter interface {
	// ParseHost parses a request's Host: ok is false when it is not
	// under the domain (the request is the control plane's); err is set
	// when it is, but does not name a port of a sandbox canonically.
	ParseHost(host string) (sandboxID string, port int, ok bool, err error)
	// ServeOtherPort serves a host-addressed request to a port that is
	// neither envd's nor one of Config.Ports (a service URL, with its own
	// credentials: no E2B token opens it); admit is called with the
	// principal the request authenticated as before anything is proxied.
	// It returns an error only when it wrote nothing.
	ServeOtherPort(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error
}

// Authenticator turns an X-API-KEY into the caller's principal. Unknown
// keys are errdefs.ErrUnauthenticated.
type Authenticator func(key string) (tenant.Principal, error)

// RateLimiter decides whether one more request of key may be served now
// (httpapi.RateLimiter; internal/ratelimit implements it). Safe for
// concurrent use.
type RateLimiter interface {
	Allow(key string) (retryAfter time.Duration, ok bool)
}

// Config configures a Server.
type Config struct {
	// Authenticate resolves X-API-KEY (required).
	Authenticate Authenticator
	// Templates maps E2B template ids to agentbox template names; nil is
	// DefaultTemplates. A template id not in it is an agentbox template
	// name or a snapshot (checkpoint) id.
	Templates map[string]string
	// TokenKey signs envd access tokens (at least 32 bytes); nil draws a
	// random one, so tokens do not survive a daemon restart (connect
	// returns a fresh one).
	TokenKey []byte
	// Ports serves sandbox ports other than envd's; nil: none.
	Ports map[int]PortHandler
	// Domain is reported as the sandbox domain; "" reports none. (The
	// SDK prefers E2B_SANDBOX_URL when it is set; without it, it
	// addresses https://{port}-{id}.{domain}.)
	Domain string
	// Hosts, when set, routes requests by host ({port}-{id}.{domain}):
	// envd's port and Ports as sandbox traffic, other ports to
	// Hosts.ServeOtherPort. nil: only the headers route.
	Hosts HostRouter
	// Track, when set, ties a control-plane request to the key that
	// authenticated it: the returned context ends when the key is revoked
	// (registry.Registry.Track); done is called when the request ends.
	Track func(ctx context.Context, p tenant.Principal) (_ context.Context, done func())
	// RateLimit, when set, bounds each tenant's requests (control plane
	// and sandbox traffic together); over it: 429 with Retry-After.
	RateLimit RateLimiter
	// Logger receives one line per request; nil discards them.
	Logger *slog.Logger
}

// ParseTemplateMap parses "e2bname=agentboxname" pairs over the defaults.
func ParseTemplateMap(pairs []string) (map[string]string, error) {
	m := map[string]string{}
	for k, v := range DefaultTemplates {
		m[k] = v
	}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("e2b template mapping %q: want E2BNAME=TEMPLATE: %w", p, errdefs.ErrInvalidArgument)
		}
		m[k] = v
	}
	return m, nil
}
