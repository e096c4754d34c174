// Package bridge is the host side of the API bridge: the one HTTP service a
// program inside a sandbox can reach, at 127.0.0.1:3129 inside the sandbox
// (api.BridgeAddr). The guest relays each connection to the daemon over the
// sandbox's reverse tunnel (internal/guest/tunnel.go), so the bridge learns
// which sandbox a request comes from from the tunnel it arrived on, never
// from anything the sender says. The bridge listens on no host socket.
//
// Every request carries a per-run token (Authorization: Bearer, from
// AGENTBOX_RUN_TOKEN) that must verify (signature with the pinned algorithm,
// issuer, audience, type, expiry) and belong to a live run of that very
// sandbox in its current boot (Authorizer). Then:
//
//	POST /v1/events                    a log, metric or usage record (api.BridgeEvent) into the daemon's records
//	ANY  /v1/connectors/{name}/{path...} forwarded to the named connector's base URL + path, with the
//	                                   connector's stored credential attached host-side
//
// The credential never enters the sandbox: client-supplied credentials are
// stripped, redirects are not followed, and the credential (with its
// encodings) is redacted from the response headers, informational (1xx)
// responses, body and trailers in case the upstream echoes it. The
// upstream is asked for an unencoded body; a body it sends encoded anyway
// is decoded first (gzip, deflate, br, zstd), and one in a coding the
// bridge cannot decode is refused with 502.
package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/chanlisten"
	"github.com/agentbox/agentbox/internal/contentcoding"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/urlpath"
)

// Port is the bridge's port inside every sandbox.
const Port = 3129

// Limits.
const (
	maxEventBody   = 64 << 10
	maxForwardBody = 16 << 20
	forwardTimeout = 5 * time.Minute
)

// Authorizer verifies a run token presented from inside sandboxID
// (runsecrets.Secrets.AuthorizeRun). Failures wrap errdefs.ErrUnauthenticated.
type Authorizer interface {
	AuthorizeRun(ctx context.Context, sandboxID, token string) (secrets.RunClaims, error)
}

// SecretSource resolves a stored secret host-side (secrets.Store).
type SecretSource interface {
	Secret(ctx context.Context, name string) ([]byte, error)
}

// EventSink records events sent from inside (sandboxevents.Recorder.RecordEvent).
type EventSink interface {
	RecordEvent(ctx context.Context, ev api.SandboxEvent) error
}

// Connector is a named upstream API the bridge forwards to, with the
// stored secret it attaches as a header.
type Connector struct {
	// Name is the {name} of /v1/connectors/{name}/...
	Name string `json:"name"`
	// URL is the base URL (http or https); the request path is appended.
	URL string `json:"url"`
	// Secret names the stored secret holding the credential.
	Secret string `json:"secret"`
	// Header is the header carrying the credential; default Authorization.
	Header string `json:"header,omitempty"`
	// Format is the header value with {secret} standing for the value;
	// default "Bearer {secret}".
	Format string `json:"format,omitempty"`
}

// Config configures a Bridge.
type Config struct {
	Connectors []Connector
	// Transport reaches the connectors; default a clone of
	// http.DefaultTransport without proxy settings.
	Transport http.RoundTripper
	Logger    *slog.Logger
}

// Bridge is the bridge's HTTP server over tunnelled connections.
type Bridge struct {
	auth       Authorizer
	secrets    SecretSource
	events     EventSink
	log        *slog.Logger
	connectors map[string]connector
	srv        *http.Server
	ln         *chanlisten.Listener
}

type connector struct {
	Connector
	base  *url.URL
	proxy *httputil.ReverseProxy
}

// New validates cfg and starts the bridge's server (it accepts only the
// connections handed to ServeConn). Close stops it.
func New(cfg Config, auth Authorizer, src SecretSource, events EventSink) (*Bridge, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		cfg.Transport = t
	}
	b := &Bridge{auth: auth, secrets: src, events: events, log: cfg.Logger, connectors: map[string]connector{}}
	for _, c := range cfg.Connectors {
		if err := ValidConnector(c); err != nil {
			return nil, err
		}
		if _, dup := b.connectors[c.Name]; dup {
			return nil, fmt.Errorf("connector %s defined twice: %w", c.Name, errdefs.ErrInvalidArgument)
		}
		if c.Header == "" {
			c.Header = "Authorization"
		}
		if c.Format == "" {
			c.Format = "Bearer {secret}"
		}
		base, _ := url.Parse(c.URL)
		b.connectors[c.Name] = connector{Connector: c, base: base, proxy: b.newProxy(c, base, cfg.Transport)}
	}
	b.ln = chanlisten.New(bridgeAddr{})
	b.srv = &http.Server{
		Handler:           b,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tunnelConn); ok {
				return context.WithValue(ctx, sandboxKey{}, tc.sandboxID)
			}
			return ctx
		},
	}
	go func() { _ = b.srv.Serve(b.ln) }()
	return b, nil
}

// ValidConnector checks one connector definition.
func ValidConnector(c Connector) error {
	if !secrets.NameRE.MatchString(c.Name) {
		return fmt.Errorf("connector name %q is not valid: %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if err := secrets.ValidName(c.Secret); err != nil {
		return fmt.Errorf("connector %s: %w", c.Name, err)
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("connector %s: url must be http(s)://host[:port][/path] without credentials, query or fragment: %w", c.Name, errdefs.ErrInvalidArgument)
	}
	if c.Header != "" && (strings.ContainsAny(c.Header, " :\r\n") || http.CanonicalHeaderKey(c.Header) == "Host") {
		return fmt.Errorf("connector %s: header %q is not valid: %w", c.Name, c.Header, errdefs.ErrInvalidArgument)
	}
	if c.Format != "" && (!strings.Contains(c.Format, "{secret}") || strings.ContainsAny(c.Format, "\r\n")) {
		return fmt.Errorf("connector %s: format must contain {secret}: %w", c.Name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ServeConn serves one connection made inside sandboxID to the bridge port;
// it has the shape of tunnel.Handler. The connection is closed when
// ctx ends (the tunnel is gone) or the client is done.
func (b *Bridge) ServeConn(ctx context.Context, sandboxID string, conn net.Conn) {
	tc := &tunnelConn{Conn: conn, sandboxID: sandboxID, done: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			conn.Close()
		case <-tc.done:
		}
	}()
	if !b.ln.Deliver(tc) {
		conn.Close()
	}
}

// Close stops the bridge and closes its connections.
func (b *Bridge) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := b.srv.Shutdown(ctx); err != nil {
		return b.srv.Close()
	}
	return nil
}

type sandboxKey struct{}

// tunnelConn is a connection from inside a sandbox, labelled with the
// sandbox the tunnel belongs to.
type tunnelConn struct {
	net.Conn
	sandboxID string
	once      sync.Once
	done      chan struct{}
}

func (c *tunnelConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

type bridgeAddr struct{}

func (bridgeAddr) Network() string { return "tunnel" }
func (bridgeAddr) String() string  { return api.BridgeAddr }

// ServeHTTP authenticates the request and routes it.
func (b *Bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sandboxID, _ := r.Context().Value(sandboxKey{}).(string)
	if sandboxID == "" {
		// Not through a sandbox's tunnel: there is no identity to check a
		// token against.
		b.fail(w, r, "", http.StatusForbidden, fmt.Errorf("the bridge is reachable only from inside a sandbox"))
		return
	}
	tok, ok := bearer(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentbox-bridge"`)
		b.fail(w, r, sandboxID, http.StatusUnauthorized, fmt.Errorf("a run token is required (Authorization: Bearer $%s)", api.RunTokenEnv))
		return
	}
	claims, err := b.auth.AuthorizeRun(r.Context(), sandboxID, tok)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentbox-bridge", error="invalid_token"`)
		b.fail(w, r, sandboxID, http.StatusUnauthorized, err)
		return
	}
	r.Header.Del("Authorization")
	switch {
	case r.URL.Path == "/v1/events":
		b.event(w, r, claims)
	case strings.HasPrefix(r.URL.Path, "/v1/connectors/"):
		b.forward(w, r, claims)
	default:
		b.fail(w, r, sandboxID, http.StatusNotFound, fmt.Errorf("no route for %s", r.URL.Path))
	}
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// fail answers with a JSON api.Error and logs the cause. Client-visible
// text is generic for authentication failures.
func (b *Bridge) fail(w http.ResponseWriter, r *http.Request, sandboxID string, status int, err error) {
	b.log.WarnContext(r.Context(), "bridge request refused", "sandbox", sandboxID, "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	msg := err.Error()
	code := errdefs.Code(err)
	switch status {
	case http.StatusUnauthorized:
		msg, code = "run token missing, invalid, expired or revoked", "unauthenticated"
	case http.StatusForbidden:
		code = "permission_denied"
	case http.StatusNotFound:
		code = "not_found"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.Error{Code: code, Message: msg})
}

func (b *Bridge) event(w http.ResponseWriter, r *http.Request, c secrets.RunClaims) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		b.fail(w, r, c.Sandbox, http.StatusMethodNotAllowed, fmt.Errorf("use POST: %w", errdefs.ErrInvalidArgument))
		return
	}
	var in api.BridgeEvent
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEventBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		b.fail(w, r, c.Sandbox, http.StatusBadRequest, fmt.Errorf("body must be one JSON event {type, message, name, value, attrs}: %w", errdefs.ErrInvalidArgument))
		return
	}
	ev := api.SandboxEvent{
		Time: time.Now().UTC(), SandboxID: c.Sandbox, RunID: c.Run,
		Type: in.Type, Message: in.Message, Name: in.Name, Value: in.Value, Attrs: in.Attrs,
	}
	if err := b.events.RecordEvent(r.Context(), ev); err != nil {
		status := http.StatusInternalServerError
		if errdefs.IsInvalidArgument(err) {
			status = http.StatusBadRequest
		}
		b.fail(w, r, c.Sandbox, status, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// forward proxies /v1/connectors/{name}/{rest} to the connector.
func (b *Bridge) forward(w http.ResponseWriter, r *http.Request, c secrets.RunClaims) {
	// The path as sent (escaped): it is canonicalised once and sent to the
	// connector exactly so, never decoded twice on its way.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/connectors/")
	if !ok {
		b.fail(w, r, c.Sandbox, http.StatusNotFound, fmt.Errorf("no route for %s", r.URL.Path))
		return
	}
	name, raw, _ := strings.Cut(rest, "/")
	for _, seg := range strings.Split(raw, "/") {
		if seg == ".." || seg == "." {
			b.fail(w, r, c.Sandbox, http.StatusBadRequest, fmt.Errorf("path segments . and .. are not allowed: %w", errdefs.ErrInvalidArgument))
			return
		}
	}
	path, err := urlpath.Canonical("/" + raw)
	if err != nil {
		b.fail(w, r, c.Sandbox, http.StatusBadRequest, err)
		return
	}
	conn, ok := b.connectors[name]
	if !ok {
		b.fail(w, r, c.Sandbox, http.StatusNotFound, fmt.Errorf("no connector %q", name))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForwardBody)
	// A client that half-closes after its request (nc, HTTP/1.0 style)
	// makes net/http cancel the request's context; the upstream call is
	// bounded by its own timeout instead, and a vanished client still ends
	// it when writing the response fails.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), forwardTimeout)
	defer cancel()
	cred, err := b.secrets.Secret(ctx, conn.Secret)
	if err != nil {
		b.fail(w, r, c.Sandbox, http.StatusBadGateway, fmt.Errorf("connector %s: credential unavailable", name))
		b.log.ErrorContext(r.Context(), "bridge connector credential", "connector", name, "secret", conn.Secret, "err", err)
		return
	}
	ctx = context.WithValue(ctx, fwdKey{}, &fwd{path: path, cred: cred})
	b.log.InfoContext(ctx, "bridge forward", "sandbox", c.Sandbox, "run", c.Run, "connector", name, "method", r.Method, "path", path, "secret", conn.Secret)
	conn.proxy.ServeHTTP(w, r.WithContext(ctx))
}

type fwdKey struct{}

// fwd is what the proxy's hooks need of one forwarded request.
type fwd struct {
	path string // canonical and escaped (urlpath.Canonical): JoinPath takes escaped elements
	cred []byte
}

func (b *Bridge) newProxy(c Connector, base *url.URL, rt http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: scrub1xx{rt: rt, secret: c.Secret},
		Rewrite: func(pr *httputil.ProxyRequest) {
			f := pr.In.Context().Value(fwdKey{}).(*fwd)
			out := pr.Out
			out.URL = base.JoinPath(f.path)
			if !strings.HasPrefix(out.URL.Path, "/") { // base URL without a path
				out.URL.Path = "/" + out.URL.Path
				out.URL.RawPath = ""
			}
			out.URL.RawQuery = pr.In.URL.RawQuery
			out.Host = ""
			// Nothing the sandbox says about credentials or its own
			// identity goes upstream.
			for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie", c.Header,
				"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				out.Header.Del(h)
			}
			out.Header.Set(c.Header, strings.ReplaceAll(c.Format, "{secret}", string(f.cred)))
			// The client's codings are not asked for: the response must be
			// scrubbed, and whatever coding comes back anyway is decoded
			// first (ModifyResponse).
			out.Header.Set("Accept-Encoding", "identity")
		},
		ModifyResponse: func(resp *http.Response) error {
			f := resp.Request.Context().Value(fwdKey{}).(*fwd)
			resp.Header.Del("Set-Cookie")
			if err := redact.Response(resp, redact.New(map[string][]byte{c.Secret: f.cred}), contentcoding.Limits{}); err != nil {
				return fmt.Errorf("scrubbing the response: %w", err)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			b.log.WarnContext(r.Context(), "bridge upstream", "connector", c.Name, "err", err)
			status, msg := http.StatusBadGateway, "connector "+c.Name+" did not answer"
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				status = http.StatusRequestEntityTooLarge
			}
			if errors.Is(err, contentcoding.ErrUnsupported) {
				msg = "connector " + c.Name + " answered in a content coding the bridge cannot decode and scrub"
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(api.Error{Code: "unavailable", Message: msg})
		},
	}
}

// scrub1xx redacts the connector's credential from informational
// responses before the ReverseProxy forwards them (see redact.Trace).
type scrub1xx struct {
	rt     http.RoundTripper
	secret string // the connector's secret name
}

func (s scrub1xx) RoundTrip(r *http.Request) (*http.Response, error) {
	if f, ok := r.Context().Value(fwdKey{}).(*fwd); ok {
		r = r.WithContext(redact.Trace(r.Context(), map[string][]byte{s.secret: f.cred}))
	}
	return s.rt.RoundTrip(r)
}
