package serviceurl

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// errNoService is the one answer to every request the gateway refuses: no
// token, a bad, expired or revoked one, a token for another port, sandbox
// or tenant, a port that is not exposed or not spelled canonically, an
// unknown sandbox. The same status, code and text for all, so a refusal
// tells nothing about what exists. (The reason goes to the debug log.)
var errNoService = fmt.Errorf("no such service, or no valid token for it: %w", errdefs.ErrNotFound)

// Match reports whether r is addressed to a service URL: its host is under
// the service domain, or its path is in /v1/sandboxes/*/ports/. Such a
// request is the gateway's (ServeService), whether or not it parses: it
// never reaches the API.
func (e *Exposures) Match(r *http.Request) bool {
	if _, ok, _ := ParseHost(r.Host, e.domainHost()); ok {
		return true
	}
	return IsServicePath(r.URL.EscapedPath())
}

// domainHost is the service domain without a port.
func (e *Exposures) domainHost() string {
	d := e.cfg.Domain
	if h, _, err := net.SplitHostPort(d); err == nil {
		d = h
	}
	return d
}

// ServeService serves a request Match accepted: it finds the target in
// the host or the path, authenticates the request by an exposure's
// token (header, bearer, cookie) or browser-link parameter, calls admit
// with the exposure's tenant (the listener's rate limit, connection
// accounting) and proxies the request to the sandbox's port with the
// token removed. A link parameter is exchanged for a cookie scoped to the
// service (its host, or its path) and answered with a redirect to the
// same address without it. Every refusal is the same not-found error; the
// errors it returns before writing are for the caller to map.
func (e *Exposures) ServeService(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error {
	t, hostBased, rest, err := e.target(r)
	if err != nil {
		return e.refuse(r, err)
	}
	now := e.cfg.Now()
	// Path-based addresses share one origin (the daemon's): a page of one
	// service could fetch another's with the browser's cookies. With a
	// service domain, where each service is an origin of its own, the
	// browser's credentials (link, cookie) are taken on host-based
	// addresses only.
	browser := hostBased || e.cfg.Domain == ""
	cred, fromLink := e.credential(r, browser)
	if cred == "" {
		return e.refuse(r, errors.New("no token"))
	}
	p, err := ParseToken(cred)
	if err != nil || p.Link != fromLink {
		return e.refuse(r, errors.New("malformed token"))
	}
	rec, ok := e.lookup(p.ExposureID)
	if !ok {
		return e.refuse(r, errors.New("unknown or revoked exposure"))
	}
	if err := e.cfg.Signer.Verify(p, rec, now); err != nil {
		return e.refuse(r, err)
	}
	if rec.Sandbox != t.Sandbox || rec.Port != t.Port {
		return e.refuse(r, errors.New("token of another service"))
	}
	if e.reserved(t.Port) {
		return e.refuse(r, errors.New("a platform port"))
	}
	principal := tenant.Principal{Tenant: tenant.Owner(rec.Tenant), Scope: api.ScopeFull}
	if admit != nil {
		if err := admit(principal); err != nil {
			return err
		}
	}
	scope := "/"
	if !hostBased {
		scope = PathOf(t)
	}
	if fromLink {
		// The parameter becomes a cookie on this service alone; the
		// redirect drops it from the address bar and the history.
		http.SetCookie(w, &http.Cookie{
			Name: api.ServiceCookie, Value: e.cfg.Signer.Token(rec), Path: scope,
			Expires: rec.ExpiresAt, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode,
		})
		q := r.URL.Query()
		q.Del(api.ServiceTokenParam)
		u := url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: q.Encode()}
		http.Redirect(w, r, u.String(), http.StatusSeeOther)
		return nil
	}
	stripCredentials(r)
	req := Request{Target: t, Path: rest}
	if !hostBased {
		req.Prefix = scope
	}
	r = r.WithContext(tenant.WithPrincipal(r.Context(), principal))
	if err := e.proxy.Serve(w, r, req); err != nil {
		if errdefs.IsNotFound(err) {
			return e.refuse(r, err) // deleted meanwhile
		}
		return err
	}
	return nil
}

// target finds the service r is addressed to; rest is the escaped path
// the service sees ("" keeps the request's, for host-based addresses).
func (e *Exposures) target(r *http.Request) (t Target, hostBased bool, rest string, err error) {
	if t, ok, err := ParseHost(r.Host, e.domainHost()); ok {
		return t, true, "", err
	}
	t, rest, err = ParsePath(r.URL.EscapedPath())
	return t, false, rest, err
}

// credential returns the token or link parameter r presents, in this
// order: the link parameter, the header, a bearer token of ours, the
// cookie; the link and the cookie only when browser is set.
func (e *Exposures) credential(r *http.Request, browser bool) (cred string, link bool) {
	if browser && r.URL.RawQuery != "" {
		if v := r.URL.Query()[api.ServiceTokenParam]; len(v) > 0 {
			if len(v) > 1 {
				return "", false
			}
			return v[0], true
		}
	}
	if v := r.Header.Values(api.ServiceTokenHeader); len(v) > 0 {
		if len(v) > 1 {
			return "", false
		}
		return v[0], false
	}
	if b, ok := ourBearer(r); ok {
		return b, false
	}
	if c, err := r.Cookie(api.ServiceCookie); err == nil && browser {
		return c.Value, false
	}
	return "", false
}

// ourBearer returns the request's bearer credential when it is one of our
// tokens (other bearer credentials are the service's and pass through).
func ourBearer(r *http.Request) (string, bool) {
	const prefix = "bearer "
	a := r.Header.Get("Authorization")
	if len(a) <= len(prefix) || !strings.EqualFold(a[:len(prefix)], prefix) {
		return "", false
	}
	tok := strings.TrimSpace(a[len(prefix):])
	return tok, strings.HasPrefix(tok, tokenPrefix)
}

// stripCredentials removes the gateway's credentials from r, so the
// service inside never sees a token.
func stripCredentials(r *http.Request) {
	r.Header.Del(api.ServiceTokenHeader)
	if _, ok := ourBearer(r); ok {
		r.Header.Del("Authorization")
	}
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name != api.ServiceCookie {
			r.AddCookie(c)
		}
	}
}

// refuse logs why r was refused and returns the uniform refusal.
func (e *Exposures) refuse(r *http.Request, why error) error {
	e.log.DebugContext(r.Context(), "service request refused", "host", r.Host, "path", r.URL.Path, "why", why)
	return errNoService
}
