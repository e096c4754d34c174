package e2b

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/connlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Headers of E2B's SDK.
const (
	headerAPIKey      = "X-API-KEY"
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
	// headerTrafficToken carries the traffic access token (ports other
	// than envd's).
	headerTrafficToken = "E2B-Traffic-Access-Token"
)

// Server serves the E2B API. Safe for concurrent use.
type Server struct {
	sb      Sandboxes
	cfg     Config
	log     *slog.Logger
	tok     tokens
	control *http.ServeMux
	envd    http.Handler
	procs   *processes
}

// New returns a Server calling sb.
func New(sb Sandboxes, cfg Config) (*Server, error) {
	if sb == nil || cfg.Authenticate == nil {
		return nil, fmt.Errorf("e2b: sandboxes and an authenticator are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Templates == nil {
		cfg.Templates = DefaultTemplates
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	key := cfg.TokenKey
	if len(key) == 0 {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("e2b: drawing the token key: %w", err)
		}
	} else if len(key) < 32 {
		return nil, fmt.Errorf("e2b: the token key has %d bytes, want 32 at least: %w", len(key), errdefs.ErrInvalidArgument)
	}
	s := &Server{sb: sb, cfg: cfg, log: cfg.Logger, tok: tokens{key: key}, control: http.NewServeMux(), procs: newProcesses()}
	s.controlRoutes()
	s.envd = s.envdHandler()
	return s, nil
}

type callerKey struct{}

// CallerFrom returns who made the request of ctx, for run records: the
// principal's name with the prefix "e2b:" for control-plane keys, or
// "e2b-envd:" for sandbox traffic authenticated by an access token.
func CallerFrom(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}

// ServeHTTP routes sandbox traffic (E2b-Sandbox-Id) to envd or the port's
// handler and everything else to the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "e2b request", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("sandbox", r.Header.Get(headerSandboxID)), slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)))
	}()
	w = rec
	w.Header().Set("Cache-Control", "no-store")
	if s.cfg.Hosts != nil {
		if id, port, ok, err := s.cfg.Hosts.ParseHost(r.Host); ok {
			s.serveHost(w, r, id, port, err)
			return
		}
	}
	if id := r.Header.Get(headerSandboxID); id != "" {
		port := EnvdPort
		if v := r.Header.Get(headerSandboxPort); v != "" {
			n, err := parsePort(v)
			if err != nil {
				writeError(w, r, s.log, err)
				return
			}
			port = n
		}
		s.serveSandbox(w, r, id, port)
		return
	}
	p, err := s.authenticate(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if !p.CanWrite() && r.Method != http.MethodGet {
		writeError(w, r, s.log, fmt.Errorf("the API key is read-only: %w", errdefs.ErrPermissionDenied))
		return
	}
	if err := s.admit(r, p); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	ctx := context.WithValue(tenant.WithPrincipal(r.Context(), p), callerKey{}, "e2b:"+p.String())
	if s.cfg.Track != nil {
		var done func()
		ctx, done = s.cfg.Track(ctx, p)
		defer done()
	}
	r = r.WithContext(ctx)
	if _, pattern := s.control.Handler(r); pattern == "" {
		writeError(w, r, s.log, fmt.Errorf("no route for %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
		return
	}
	s.control.ServeHTTP(w, r)
}

// authenticate resolves the control plane's X-API-KEY (or an
// "Authorization: Bearer" key, E2B's access-token form).
func (s *Server) authenticate(r *http.Request) (tenant.Principal, error) {
	key := r.Header.Get(headerAPIKey)
	if key == "" {
		if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			key = strings.TrimSpace(h[7:])
		}
	}
	if key == "" {
		return tenant.Principal{}, fmt.Errorf("missing X-API-KEY: %w", errdefs.ErrUnauthenticated)
	}
	p, err := s.cfg.Authenticate(key)
	if err != nil {
		return tenant.Principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	return p, nil
}

// serveHost serves a request addressed by host ({port}-{id}.{domain}):
// envd's port and the ports of Config.Ports are sandbox traffic, as with
// the headers; any other port is the HostRouter's (service URLs).
func (s *Server) serveHost(w http.ResponseWriter, r *http.Request, id string, port int, perr error) {
	if perr != nil {
		writeError(w, r, s.log, perr)
		return
	}
	if _, ok := s.cfg.Ports[port]; ok || port == EnvdPort {
		s.serveSandbox(w, r, id, port)
		return
	}
	err := s.cfg.Hosts.ServeOtherPort(w, r, func(p tenant.Principal) error { return s.admit(r, p) })
	if err != nil {
		writeError(w, r, s.log, err)
	}
}

// serveSandbox serves traffic to a sandbox's port after checking the
// sandbox's access token, as the sandbox's owner. Envd's port takes the
// envd access token (X-Access-Token) only; the other ports also take the
// traffic access token (E2B-Traffic-Access-Token), which the
// code-interpreter SDK sends on the calls that carry no envd token.
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	owner, err := s.tok.check(r.Header.Get(headerAccessToken), id)
	if err != nil && port != EnvdPort && r.Header.Get(headerTrafficToken) != "" {
		owner, err = s.tok.checkFor(purposeTraffic, r.Header.Get(headerTrafficToken), id)
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	p := tenant.Principal{Tenant: owner, Scope: api.ScopeFull}
	if err := s.admit(r, p); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	ctx := context.WithValue(tenant.WithPrincipal(r.Context(), p), callerKey{}, "e2b-envd:"+p.String())
	ctx = context.WithValue(ctx, sandboxKey{}, id)
	r = r.WithContext(ctx)
	if port == EnvdPort {
		s.envd.ServeHTTP(w, r)
		return
	}
	if h, ok := s.cfg.Ports[port]; ok {
		// The service inside never sees the sandbox's tokens.
		r.Header.Del(headerAccessToken)
		r.Header.Del(headerTrafficToken)
		if err := h.ServeSandboxPort(w, r, id); err != nil {
			writeError(w, r, s.log, err)
		}
		return
	}
	writeError(w, r, s.log, fmt.Errorf("sandbox %s: port %d is not served: %w", id, port, errdefs.ErrNotFound))
}

// admit is the step after a request authenticated as p: its connection
// stops counting as unauthenticated (internal/connlimit), and p's tenant's
// request rate is checked.
func (s *Server) admit(r *http.Request, p tenant.Principal) error {
	connlimit.MarkAuthenticated(r.Context())
	if s.cfg.RateLimit == nil {
		return nil
	}
	if after, ok := s.cfg.RateLimit.Allow(p.Tenant); !ok {
		return errdefs.WithRetryAfter(fmt.Errorf("tenant %s is over its request rate: %w", p.Tenant, errdefs.ErrResourceExhausted), after)
	}
	return nil
}

// parsePort parses a port number in canonical decimal form only (no sign,
// no leading zero, no other base), 1-65535.
func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, fmt.Errorf("port %q is not a canonical port number: %w", s, errdefs.ErrInvalidArgument)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port %q is not a canonical port number: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	n, _ := strconv.Atoi(s)
	if n > 65535 {
		return 0, fmt.Errorf("port %q is out of range: %w", s, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

type sandboxKey struct{}

// sandboxFrom is the sandbox of an envd request.
func sandboxFrom(ctx context.Context) string {
	s, _ := ctx.Value(sandboxKey{}).(string)
	return s
}

// statusRecorder remembers the status for the log line; it passes
// Flush on for streaming responses.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
