package serviceurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Proxy is the host's reverse proxy into sandboxes: it serves an HTTP
// request (WebSocket upgrades and streamed responses included) with the
// service listening on a port inside a sandbox, reached through the
// sandbox's guest (guest.OpDial), since a sandbox has no route from the
// host. It knows nothing of tokens: the caller decides who may reach what
// (Gateway with exposure tokens; the E2B front door with its own) and
// puts the principal the sandbox is looked up as in the request's context.
//
// Every request acquires the sandbox through the core: a paused or
// hibernated sandbox is woken, and the request counts as activity (its
// idle clock restarts when the response, or the upgraded connection,
// ends). Connections to a sandbox's ports are kept alive and reused
// between requests. Safe for concurrent use.
type Proxy struct {
	core sandbox.Core
	log  *slog.Logger
	rp   *httputil.ReverseProxy
	tr   *http.Transport
}

// NewProxy returns a proxy reaching sandboxes through core; log is
// required.
func NewProxy(core sandbox.Core, log *slog.Logger) *Proxy {
	p := &Proxy{core: core, log: log}
	p.tr = &http.Transport{
		DialContext:           p.dial,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass the service's encoding through as it is
		ForceAttemptHTTP2:     false,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     p.tr,
		FlushInterval: -1, // streamed responses (SSE, chunked) flush at once
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if st, ok := r.Context().Value(stateKey{}).(*reqState); ok {
				st.err = err
			}
		},
	}
	return p
}

// Close drops the idle connections kept to services.
func (p *Proxy) Close() error {
	p.tr.CloseIdleConnections()
	return nil
}

type stateKey struct{}

// reqState is one request's: the guest to dial, where to, what failed.
type reqState struct {
	guest  *client.Client
	target Target
	path   string // escaped path the service sees
	prefix string // X-Forwarded-Prefix, path-based only
	err    error
}

// Request says where Serve sends a request.
type Request struct {
	Target Target
	// Path is the escaped path (with no query) the service sees; "" keeps
	// the request's.
	Path string
	// Prefix, when set, is sent as X-Forwarded-Prefix (the path the
	// service lives under on the caller's side, for path-based addresses).
	Prefix string
}

// Serve proxies r to the service of req.Target. The sandbox is looked up
// as the principal of r's context sees it (errdefs.ErrNotFound when it
// cannot). It returns an error only when nothing was written to w: the
// sandbox could not be acquired (not found, cannot wake), the service
// could not be reached (errdefs.ErrUnavailable: nothing listens on the
// port, the guest predates dialling), or the service's answer was not
// HTTP. The caller maps it to a response.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, req Request) error {
	ctx := r.Context()
	h, release, err := p.core.Acquire(ctx, req.Target.Sandbox)
	if err != nil {
		return err
	}
	g := h.Guest()
	done := h.Busy()
	release()
	defer done()
	if g == nil {
		return fmt.Errorf("sandbox %s has no guest: %w", req.Target.Sandbox, errdefs.ErrUnavailable)
	}
	path := req.Path
	if path == "" {
		path = r.URL.EscapedPath()
	}
	st := &reqState{guest: g, target: req.Target, path: path, prefix: req.Prefix}
	r = r.WithContext(context.WithValue(ctx, stateKey{}, st))
	p.rp.ServeHTTP(w, r)
	if st.err != nil {
		if errors.Is(st.err, context.Canceled) && ctx.Err() != nil {
			return nil // the client went away
		}
		if errdefs.Code(st.err) == "internal" {
			return fmt.Errorf("proxying to port %d of sandbox %s: %v: %w", req.Target.Port, req.Target.Sandbox, st.err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("proxying to port %d of sandbox %s: %w", req.Target.Port, req.Target.Sandbox, st.err)
	}
	return nil
}

// transportHost names a target as the transport's connection pool key:
// connections are reused only for the same port of the same sandbox.
func transportHost(t Target) string {
	return t.Sandbox + "-" + strconv.Itoa(t.Port) + ".sandbox.invalid"
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	st := pr.In.Context().Value(stateKey{}).(*reqState)
	pr.SetXForwarded()
	u := &url.URL{Scheme: "http", Host: transportHost(st.target), RawQuery: pr.In.URL.RawQuery}
	if path, err := url.PathUnescape(st.path); err == nil {
		u.Path = path
		if u.EscapedPath() != st.path {
			u.RawPath = st.path
		}
	} else {
		u.Path = "/"
	}
	pr.Out.URL = u
	pr.Out.Host = pr.In.Host // the service sees the address the client used
	if st.prefix != "" {
		pr.Out.Header.Set("X-Forwarded-Prefix", strings.TrimSuffix(st.prefix, "/"))
	}
}

// dial connects to the target of the request being dialled for through
// its sandbox's guest. The transport dials with the request's context
// values.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	st, ok := ctx.Value(stateKey{}).(*reqState)
	if !ok || addr != transportHost(st.target)+":80" {
		return nil, fmt.Errorf("service proxy: dial of %s outside a request: %w", addr, errdefs.ErrInternal)
	}
	return st.guest.DialPort(ctx, st.target.Port)
}
