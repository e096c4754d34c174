// Package agentbox is the Go client of the agentbox daemon's HTTP API v1.
//
// A Client talks to one daemon, over its unix socket (trusted, no key) or
// over TCP with a bearer API key:
//
//	c, err := agentbox.NewFromEnv() // AGENTBOX_HOST, AGENTBOX_API_KEY
//	sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
//	defer sb.Delete(context.WithoutCancel(ctx))
//	res, err := sb.Run(ctx, "echo hello")
//	fmt.Printf("%s exit=%d\n", res.Stdout, res.ExitCode)
//
// Errors the daemon reports are *APIError (test them with IsNotFound,
// IsConflict, ...); failures to reach the daemon are *ConnectionError.
// A non-zero exit status of a command is a Result, never an error.
//
// The package imports only the standard library and the public wire types in
// github.com/agentbox/agentbox/api, never the daemon's internal packages.
// A Client and the Sandboxes it returns are safe for concurrent use.
package agentbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/agentbox/agentbox/api"
)

// DefaultHost is the daemon address used when none is configured.
const DefaultHost = "unix:///run/agentbox/agentbox.sock"

// Environment variables read by NewFromEnv.
const (
	EnvHost   = "AGENTBOX_HOST"
	EnvAPIKey = "AGENTBOX_API_KEY"
	// EnvCACert names a PEM file of CA certificates that https hosts are
	// verified against instead of the system roots.
	EnvCACert = "AGENTBOX_CA_CERT"
)

// Client talks to one agentbox daemon. Create it with New or NewFromEnv.
type Client struct {
	host   string   // as configured, for error messages
	base   *url.URL // scheme://authority every request path is joined to
	apiKey string
	hc     *http.Client
}

// Option configures a Client in New.
type Option func(*config)

type config struct {
	host   string
	apiKey string
	hc     *http.Client
	caPEM  []byte
}

// WithHost sets the daemon address: "unix:///path/to.sock",
// "http://host:port" or "https://host:port". A bare "host:port" means http.
func WithHost(host string) Option { return func(c *config) { c.host = host } }

// WithAPIKey sets the bearer key sent on every request (required on TCP).
func WithAPIKey(key string) Option { return func(c *config) { c.apiKey = key } }

// WithCACert makes the client verify an https host's certificate against
// the PEM CA certificates in pem instead of the system roots (for a daemon
// serving a certificate of a private CA, or a self-signed one). It does not
// apply with WithHTTPClient, whose transport is used as given.
func WithCACert(pem []byte) Option { return func(c *config) { c.caPEM = pem } }

// WithHTTPClient uses hc for every request. For a unix host whose hc has no
// Transport, a copy of hc is given one that dials the socket. hc should have
// no overall Timeout: exec and build streams last as long as the command.
func WithHTTPClient(hc *http.Client) Option { return func(c *config) { c.hc = hc } }

// New returns a Client for the daemon at DefaultHost unless WithHost says
// otherwise. It does not contact the daemon.
func New(opts ...Option) (*Client, error) {
	cfg := config{host: DefaultHost}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.host == "" {
		cfg.host = DefaultHost
	}
	c := &Client{host: cfg.host, apiKey: cfg.apiKey}

	var socket string
	switch {
	case strings.HasPrefix(cfg.host, "unix://"):
		socket = strings.TrimPrefix(cfg.host, "unix://")
		if socket == "" {
			return nil, fmt.Errorf("agentbox: host %q: empty socket path", cfg.host)
		}
		c.base = &url.URL{Scheme: "http", Host: "agentbox"}
	case strings.HasPrefix(cfg.host, "http://"), strings.HasPrefix(cfg.host, "https://"):
		u, err := url.Parse(cfg.host)
		if err != nil {
			return nil, fmt.Errorf("agentbox: parsing host %q: %w", cfg.host, err)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("agentbox: host %q has no address", cfg.host)
		}
		c.base = &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")}
	case strings.Contains(cfg.host, "://"):
		return nil, fmt.Errorf("agentbox: host %q: unsupported scheme (want unix://, http:// or https://)", cfg.host)
	default:
		c.base = &url.URL{Scheme: "http", Host: cfg.host}
	}

	switch {
	case cfg.hc != nil && (socket == "" || cfg.hc.Transport != nil):
		c.hc = cfg.hc
	case cfg.hc != nil:
		hc := *cfg.hc
		hc.Transport = unixTransport(socket)
		c.hc = &hc
	case socket != "":
		c.hc = &http.Client{Transport: unixTransport(socket)}
	default:
		t := http.DefaultTransport.(*http.Transport).Clone()
		if cfg.caPEM != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(cfg.caPEM) {
				return nil, fmt.Errorf("agentbox: CA certificates: no PEM certificate found")
			}
			t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		c.hc = &http.Client{Transport: t}
	}
	return c, nil
}

// NewFromEnv is New configured from AGENTBOX_HOST (default DefaultHost),
// AGENTBOX_API_KEY and AGENTBOX_CA_CERT (a PEM file, see WithCACert),
// followed by opts.
func NewFromEnv(opts ...Option) (*Client, error) {
	base := []Option{WithHost(os.Getenv(EnvHost)), WithAPIKey(os.Getenv(EnvAPIKey))}
	if path := os.Getenv(EnvCACert); path != "" {
		pem, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("agentbox: reading %s: %w", EnvCACert, err)
		}
		base = append(base, WithCACert(pem))
	}
	return New(append(base, opts...)...)
}

// Host returns the daemon address the client was configured with.
func (c *Client) Host() string { return c.host }

func unixTransport(socket string) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}
	return t
}

// request describes one API call.
type request struct {
	method string
	path   string      // below /v1, already escaped
	query  url.Values  // optional
	json   any         // JSON body, or nil
	body   io.Reader   // raw body (when json is nil)
	ctype  string      // Content-Type of body
	size   int64       // Content-Length of body when known, else -1
	header http.Header // extra request headers, optional
}

// send performs r and returns the response when its status is 2xx; any other
// status is decoded into an *APIError and the body closed. The caller closes
// the returned body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base.String() + "/v1" + r.path // r.path is already escaped
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}

	body, size, ctype := r.body, r.size, r.ctype
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("agentbox: encoding %s %s request: %w", r.method, r.path, err)
		}
		body, size, ctype = bytes.NewReader(b), int64(len(b)), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agentbox: building %s %s request: %w", r.method, r.path, err)
	}
	if tp, ok := ctx.Value(traceParentKey{}).(string); ok {
		req.Header.Set("traceparent", tp)
	}
	if body != nil {
		req.ContentLength = size
		if size < 0 {
			req.ContentLength = -1 // unknown: stream chunked, never buffer
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
	}
	for k, vs := range r.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set(api.VersionHeader, api.Version)
	req.Header.Set("User-Agent", "agentbox-go/"+api.Version)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}

	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			return nil, fmt.Errorf("agentbox: %s %s: %w", r.method, r.path, ctxErr)
		}
		var ue *url.Error // its text repeats the method and URL: keep the cause
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &ConnectionError{Host: c.host, Op: r.method + " " + r.path, Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// call performs r and decodes a JSON response into out (when non-nil).
func (c *Client) call(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return &ConnectionError{Host: c.host, Op: r.method + " " + r.path, Err: wrapf(err, "decoding response")}
	}
	return nil
}

// Health checks that the daemon answers. It returns nil when it does.
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if err := c.call(ctx, request{method: http.MethodGet, path: "/health"}, &out); err != nil {
		return wrapf(err, "checking daemon health")
	}
	if out.Status != "ok" {
		return fmt.Errorf("checking daemon health: daemon reports status %q", out.Status)
	}
	return nil
}

// Info returns the daemon's version, backend and capabilities.
func (c *Client) Info(ctx context.Context) (api.Info, error) {
	var info api.Info
	if err := c.call(ctx, request{method: http.MethodGet, path: "/info"}, &info); err != nil {
		return api.Info{}, wrapf(err, "getting daemon info")
	}
	return info, nil
}

// MCPEndpoint returns the URL of the daemon's Model Context Protocol
// endpoint (POST /mcp, streamable HTTP) and an http.Client that reaches it
// as this Client does: over the unix socket or TCP/TLS, sending the API key
// and the version header on every request. `agentbox mcp` bridges stdio to
// it; any MCP client library can use the pair.
func (c *Client) MCPEndpoint() (string, *http.Client) {
	hc := *c.hc
	hc.Transport = headerTransport{base: cmp.Or[http.RoundTripper](c.hc.Transport, http.DefaultTransport), apiKey: c.apiKey}
	return c.base.String() + "/mcp", &hc
}

// headerTransport adds the client's headers to each request.
type headerTransport struct {
	base   http.RoundTripper
	apiKey string
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(api.VersionHeader, api.Version)
	r.Header.Set("User-Agent", "agentbox-go/"+api.Version)
	if t.apiKey != "" {
		r.Header.Set("Authorization", "Bearer "+t.apiKey)
	}
	return t.base.RoundTrip(r)
}
