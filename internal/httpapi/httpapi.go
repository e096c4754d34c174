package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// DefaultMaxBodyBytes limits JSON request bodies when Options.MaxBodyBytes
// is zero.
const DefaultMaxBodyBytes = 1 << 20

// Options configure the handler returned by New. One handler serves one
// kind of listener: the unix socket (trusted, RequireAuth false) or TCP
// (RequireAuth true with APIKeys, AllowedHosts for DNS-rebinding defence).
type Options struct {
	// Logger receives one line per request; nil discards them.
	Logger *slog.Logger
	// Version is sent in the Agentbox-Version header of every response.
	Version string
	// MaxBodyBytes limits JSON bodies (413 beyond); 0 means 1 MiB.
	MaxBodyBytes int64
	// MaxUploadBytes limits streamed uploads (files, archives, stdin);
	// 0 means no limit.
	MaxUploadBytes int64
	// APIKeys are bearer keys of the admin tenant (the daemon's keys file),
	// accepted when RequireAuth is set. With RequireAuth and neither keys
	// nor Tenants, every request is refused (fail closed).
	APIKeys []string
	// Tenants authenticates tenants' API keys when RequireAuth is set, and
	// ends a request when its key is revoked. Nil: only APIKeys.
	Tenants Authenticator
	// RequireAuth demands "Authorization: Bearer <key>" on every route and
	// rejects cross-origin browser requests. Set it for TCP listeners.
	RequireAuth bool
	// AllowedHosts are the accepted Host header values ("host" matches
	// any port, "host:port" only that port; "*" accepts any host) and
	// browser Origins. Empty accepts only IP literals and "localhost"
	// (names no DNS rebinding can point at the daemon) and no Origin.
	// Checked only when RequireAuth is set.
	AllowedHosts []string
	// RateLimit, when set, bounds the requests of each authenticated
	// tenant (keyed by Principal.Tenant: all keys of a tenant share it); a
	// request over it is answered 429 with Retry-After. Checked only when
	// RequireAuth is set.
	RateLimit RateLimiter
	// Metrics serves GET /metrics (404 when nil).
	Metrics http.Handler
	// Ready reports whether the daemon can create sandboxes (GET /readyz:
	// 503 with its error when it cannot); nil means always ready.
	Ready func(ctx context.Context) error

	// Services, when set, serves the requests addressed to service URLs
	// (ServiceGateway.Match) before any other check: they carry a
	// service token, not an API key.
	Services ServiceGateway

	// MCP serves POST /mcp, the Model Context Protocol endpoint
	// (internal/mcpserver), behind the same authentication, tenancy and
	// Host/Origin checks as every route; nil answers 404.
	MCP http.Handler

	// Console serves the web console's static files under /ui/
	// (internal/console) to GET requests without credentials: they hold
	// no data, and every request the console's pages make is
	// authenticated like any other. With it, a browser request whose
	// Origin is this request's own origin (the console's pages) is
	// accepted on TCP; other Origins still need AllowedHosts. Nil: /ui/
	// is 404 and any Origin needs AllowedHosts.
	Console http.Handler
}

// RateLimiter decides whether one more request of key may be served now.
// It must be safe for concurrent use.
type RateLimiter interface {
	// Allow reports whether a request of key may proceed; when it may
	// not, retryAfter is how long until it would.
	Allow(key string) (retryAfter time.Duration, ok bool)
}

// handler is the root http.Handler.
type handler struct {
	svc     Service
	opts    Options
	log     *slog.Logger
	mux     *http.ServeMux
	keySums [][sha256.Size]byte
}

// New returns the API v1 handler serving svc.
func New(svc Service, opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	h := &handler{svc: svc, opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	for _, k := range opts.APIKeys {
		h.keySums = append(h.keySums, sha256.Sum256([]byte(k)))
	}
	for _, rt := range h.routes() {
		h.mux.HandleFunc(rt.method+" "+rt.pattern, handle(rt.fn))
	}
	return h
}

// route is one entry of the route table; api/openapi.yaml must describe
// exactly these (checked by a test).
type route struct {
	method, pattern string
	fn              handlerFunc
}

func (h *handler) routes() []route {
	return append([]route{
		{"GET", "/v1/health", h.health},
		{"GET", "/v1/info", h.info},
		{"GET", "/v1/openapi.yaml", h.openapi},
		{"POST", "/v1/sandboxes", h.createSandbox},
		{"GET", "/v1/sandboxes", h.listSandboxes},
		{"GET", "/v1/sandboxes/{id}", h.getSandbox},
		{"DELETE", "/v1/sandboxes/{id}", h.deleteSandbox},
		{"POST", "/v1/sandboxes/{id}/exec", h.exec},
		{"GET", "/v1/sandboxes/{id}/processes", h.listProcesses},
		{"GET", "/v1/sandboxes/{id}/processes/{pid}/attach", h.attach},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", h.stdin},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", h.signal},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/resize", h.resize},
		{"GET", "/v1/sandboxes/{id}/files", h.readFile},
		{"PUT", "/v1/sandboxes/{id}/files", h.writeFile},
		{"GET", "/v1/sandboxes/{id}/fs/stat", h.stat},
		{"GET", "/v1/sandboxes/{id}/fs/list", h.list},
		{"POST", "/v1/sandboxes/{id}/fs/mkdir", h.mkdir},
		{"POST", "/v1/sandboxes/{id}/fs/move", h.move},
		{"DELETE", "/v1/sandboxes/{id}/fs", h.remove},
		{"GET", "/v1/sandboxes/{id}/fs/archive", h.readArchive},
		{"PUT", "/v1/sandboxes/{id}/fs/archive", h.writeArchive},
		{"GET", "/v1/templates", listAll(h.svc.ListTemplates, func(l []api.Template) api.TemplateList { return api.TemplateList{Templates: l} })},
		{"GET", "/v1/templates/{name}", h.getTemplate},
		{"POST", "/v1/templates/build", h.buildTemplate},
		{"POST", "/mcp", h.mcp},
	}, slices.Concat(h.checkpointRoutes(), h.secretRoutes(), h.networkRoutes(), h.lifecycleRoutes(), h.upgradeRoutes(), h.storageRoutes(), h.pipelineRoutes(), h.codeRoutes(), h.poolRoutes(), h.exposureRoutes(), h.adminRoutes(), h.tenantRoutes(), h.probeRoutes(), h.auditRoutes(), h.terminalRoutes(), h.replayRoutes())...)
}

// reqState is per-request data shared by the middleware and handlers.
type reqState struct {
	id   string
	err  error     // the error behind an error response, for the log line
	resp *recorder // the response; nil outside ServeHTTP
	// resolve turns a sandbox name into its id (Service.ResolveSandbox).
	resolve func(ctx context.Context, ref string) string
}

// started reports whether the response's header has been written: from
// then on an error can no longer change the status.
func (rs *reqState) started() bool { return rs.resp != nil && rs.resp.wroteHeader }

type stateKey struct{}

func stateFrom(ctx context.Context) *reqState {
	if rs, ok := ctx.Value(stateKey{}).(*reqState); ok {
		return rs
	}
	return &reqState{}
}

// RequestID returns the id of the request ctx belongs to, or "".
func RequestID(ctx context.Context) string { return stateFrom(ctx).id }

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// ServeHTTP is the middleware chain: request id and headers, log line,
// panic recovery, Host/Origin checks, authentication, routing.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	rs := &reqState{id: newRequestID(), resp: rec, resolve: h.svc.ResolveSandbox}
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, rs))
	hdr := w.Header()
	if !h.opts.RequireAuth {
		// On TCP the version is told only to authenticated callers.
		hdr.Set(api.VersionHeader, h.opts.Version)
	}
	hdr.Set(api.RequestIDHeader, rs.id)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Cache-Control", "no-store")

	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				// Deliberate abort of a half-sent response (see handle).
				if rs.err == nil {
					rs.err = errors.New("response aborted")
				}
				h.logRequest(r, rec, rs, start)
				panic(p)
			}
			panicErr := fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			if !rec.wroteHeader {
				writeError(rec, r, fmt.Errorf("handler panicked: %w", errdefs.ErrInternal))
				rs.err = panicErr
			} else {
				rs.err = panicErr
				h.logRequest(r, rec, rs, start)
				// The response is half-sent: abort the connection so the
				// client sees a truncated reply, not a complete one.
				panic(http.ErrAbortHandler)
			}
		}
		h.logRequest(r, rec, rs, start)
	}()
	handle(h.dispatch)(rec, r)
}

// dispatch checks the caller's access to r and serves it by its route.
func (h *handler) dispatch(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Services != nil && h.opts.Services.Match(r) {
		return h.serveService(w, r)
	}
	if h.opts.Console != nil && isConsolePath(r.URL.Path) {
		return h.serveConsole(w, r)
	}
	p, who, err := h.checkAccess(r)
	if errors.Is(err, errAnonymousHealth) {
		if r.URL.Path == "/readyz" {
			return h.readyz(w, r)
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return nil
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthenticated) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentbox"`)
		}
		return err
	}
	if h.opts.RequireAuth {
		if err := h.admitAuthenticated(r, p); err != nil {
			return err
		}
		w.Header().Set(api.VersionHeader, h.opts.Version)
	}
	ctx := context.WithValue(tenant.WithPrincipal(r.Context(), p), callerKey{}, who)
	if h.opts.Tenants != nil {
		// Revoking the key cancels ctx: handlers and open streams end.
		var done func()
		ctx, done = h.opts.Tenants.Track(ctx, p)
		defer done()
	}
	r = r.WithContext(ctx)
	_, pattern := h.mux.Handler(r)
	if pattern == "" {
		return h.noRoute(w, r)
	}
	if err := authorize(p, r, pattern); err != nil {
		return err
	}
	h.mux.ServeHTTP(w, r)
	return nil
}

// noRoute turns the mux's plain-text 404/405 into JSON errors.
func (h *handler) noRoute(w http.ResponseWriter, r *http.Request) error {
	probe := &statusProbe{header: http.Header{}}
	mh, _ := h.mux.Handler(r)
	mh.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		if allow := probe.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		rs := stateFrom(r.Context())
		writeJSON(w, http.StatusMethodNotAllowed, api.Error{
			Code: "method_not_allowed", Message: fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path), RequestID: rs.id,
		})
		return nil
	}
	return fmt.Errorf("no route for %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
}

func (h *handler) logRequest(r *http.Request, rec *recorder, rs *reqState, start time.Time) {
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK
	}
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.Duration("duration", time.Since(start)),
		slog.String("request_id", rs.id),
		slog.Int64("bytes", rec.bytes),
	}
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	if rs.err != nil {
		attrs = append(attrs, slog.String("err", rs.err.Error()))
	}
	h.log.LogAttrs(r.Context(), level, "request", attrs...)
}

// checkAccess applies the TCP listener's defences and authenticates the
// caller, returning its principal and its identity for run records. The
// unix socket (RequireAuth false) is trusted: its 0600 mode is the access
// control, and its callers are the admin tenant.
func (h *handler) checkAccess(r *http.Request) (tenant.Principal, string, error) {
	if !h.opts.RequireAuth {
		return tenant.Admin, callerUnixSocket, nil
	}
	if !hostAllowed(r.Host, h.opts.AllowedHosts) {
		return tenant.Principal{}, "", fmt.Errorf("host %q is not allowed: %w", r.Host, errdefs.ErrPermissionDenied)
	}
	// A browser page must not drive the API (DNS rebinding, CSRF): any
	// request carrying an Origin is refused unless that origin's host is
	// explicitly allowed.
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		sameOrigin := err == nil && h.opts.Console != nil && isSameOrigin(r, u)
		if !sameOrigin && (err != nil || u.Host == "" || len(h.opts.AllowedHosts) == 0 || !hostAllowed(u.Host, h.opts.AllowedHosts)) {
			return tenant.Principal{}, "", fmt.Errorf("cross-origin requests are not allowed: %w", errdefs.ErrPermissionDenied)
		}
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" {
		return tenant.Principal{}, "", fmt.Errorf("cross-site requests are not allowed: %w", errdefs.ErrPermissionDenied)
	}
	if h.isHookDelivery(r) {
		// Authenticated by its signature (pipeline.go); the run belongs
		// to the hook's tenant.
		return tenant.Admin, "", nil
	}
	key, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		key, ok = wsBearer(r)
	}
	if !ok && isProbe(r) {
		return tenant.Principal{}, "", errAnonymousHealth
	}
	if !ok {
		return tenant.Principal{}, "", fmt.Errorf("missing bearer token: %w", errdefs.ErrUnauthenticated)
	}
	sum := sha256.Sum256([]byte(key))
	match := 0
	for i := range h.keySums { // no early exit: time does not depend on which key matched
		match |= subtle.ConstantTimeCompare(sum[:], h.keySums[i][:])
	}
	if match == 1 {
		return tenant.Admin, "api-key:" + hex.EncodeToString(sum[:6]), nil
	}
	if h.opts.Tenants != nil {
		if p, err := h.opts.Tenants.Authenticate(key); err == nil {
			return p, p.String(), nil
		}
	}
	return tenant.Principal{}, "", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
}

func bearer(h string) (string, bool) {
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	k := strings.TrimSpace(h[len(prefix):])
	return k, k != ""
}

// hostAllowed reports whether hostport matches an allowed entry: "host"
// matches any port, "host:port" only that port, "*" anything; comparison
// ignores case. An empty list allows IP literals and localhost.
func hostAllowed(hostport string, allowed []string) bool {
	host := hostport
	if hst, _, err := net.SplitHostPort(hostport); err == nil {
		host = hst
	}
	host = strings.Trim(host, "[]")
	if len(allowed) == 0 {
		_, err := netip.ParseAddr(host)
		return err == nil || strings.EqualFold(host, "localhost")
	}
	for _, a := range allowed {
		if a == "*" {
			return true
		}
		if strings.EqualFold(a, hostport) {
			return true
		}
		if _, _, err := net.SplitHostPort(a); err != nil && strings.EqualFold(strings.Trim(a, "[]"), host) {
			return true
		}
	}
	return false
}

// recorder notes the status and size for the log line and passes flushes
// through to the connection (streams depend on it).
type recorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	bytes       int64
}

func (rc *recorder) WriteHeader(code int) {
	if !rc.wroteHeader {
		rc.status, rc.wroteHeader = code, true
	}
	rc.ResponseWriter.WriteHeader(code)
}

func (rc *recorder) Write(b []byte) (int, error) {
	if !rc.wroteHeader {
		rc.WriteHeader(http.StatusOK)
	}
	n, err := rc.ResponseWriter.Write(b)
	rc.bytes += int64(n)
	return n, err
}

func (rc *recorder) Flush() {
	if !rc.wroteHeader {
		rc.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(rc.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (rc *recorder) Unwrap() http.ResponseWriter { return rc.ResponseWriter }

var _ http.Flusher = (*recorder)(nil)

// statusProbe captures what the mux would answer for an unmatched request.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header         { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *statusProbe) WriteHeader(code int)        { p.status = code }

// mcp hands the request to the MCP endpoint (streamable HTTP, one JSON
// answer per POST), with the authenticated caller in its context.
func (h *handler) mcp(w http.ResponseWriter, r *http.Request) error {
	if h.opts.MCP == nil {
		return fmt.Errorf("no MCP endpoint on this listener: %w", errdefs.ErrNotFound)
	}
	h.opts.MCP.ServeHTTP(w, r)
	return nil
}
