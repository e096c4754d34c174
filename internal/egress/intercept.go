package egress

import (
	"bytes"
	"context"
	"crypto/tls"
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

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/contentcoding"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/urlpath"
)

const handshakeTimeout = 15 * time.Second

// intercept terminates the sandbox's TLS for a destination with credential
// rules and proxies its requests upstream over TLS verified against the
// real roots, injecting credentials and scrubbing their values from the
// responses. The connection is bound to one origin: SNI and every Host
// header must name the CONNECT target, so an injected credential can only
// ever go to the destination its rule names. Redirects are passed to the
// client, never followed here.
func (f *front) intercept(client net.Conn, t *target, creds []Credential) {
	rec := api.EgressRecord{Kind: "connect", Destination: t.dest, Address: t.addr.String(), Decision: api.EgressAllowed, Rule: t.dec.Rule, Reason: "intercepted"}
	var sniErr string
	tc := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			sni, err := CanonicalHost(hello.ServerName)
			if err != nil || sni != t.host {
				sniErr = fmt.Sprintf("SNI %q is not the CONNECT host", hello.ServerName)
				return nil, fmt.Errorf("%s", sniErr)
			}
			return f.sb.ca.Leaf(t.host)
		},
	})
	hctx, cancel := context.WithTimeout(f.ctx, handshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		rec.Decision, rec.Reason = api.EgressDenied, "TLS handshake with sandbox failed"
		if sniErr != "" {
			rec.Reason = sniErr
		}
		f.record(rec)
		return
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return f.p.dial(ctx, t) },
		TLSClientConfig: &tls.Config{
			ServerName: t.host,
			RootCAs:    f.p.cfg.RootCAs,
			MinVersion: tls.VersionTLS12,
		},
		TLSHandshakeTimeout:   handshakeTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	defer tr.CloseIdleConnections()
	in := &interceptor{f: f, t: t, creds: creds, tr: tr}
	in.rp = &httputil.ReverseProxy{
		Rewrite:        in.rewrite,
		Transport:      scrub1xx{tr},
		ModifyResponse: in.modifyResponse,
		FlushInterval:  -1,
		ErrorLog:       slog.NewLogLogger(f.p.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f.p.log.Debug("egress upstream request failed", "sandbox", f.sb.id, "dest", t.dest, "err", err)
			msg := "upstream request failed"
			if errors.Is(err, contentcoding.ErrUnsupported) {
				msg = "the upstream's response has a content coding the proxy cannot decode and scrub"
			}
			if st, ok := r.Context().Value(reqStateKey{}).(*reqState); ok {
				st.failed, st.reason = true, msg
			}
			http.Error(w, "agentbox egress proxy: "+msg, http.StatusBadGateway)
		},
	}
	srv := &http.Server{
		Handler:           in,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(f.p.log.Handler(), slog.LevelDebug),
		// The CONNECT request's context ends once the connection is
		// hijacked; the tunnel lives as long as the proxy connection.
		BaseContext: func(net.Listener) context.Context { return f.ctx },
	}
	_ = srv.Serve(newOneConnListener(tc))
	f.record(rec)
}

type interceptor struct {
	f     *front
	t     *target
	creds []Credential
	tr    *http.Transport
	rp    *httputil.ReverseProxy
}

type reqStateKey struct{}

// reqState is what one intercepted request carries from ServeHTTP to the
// response hook.
type reqState struct {
	path    string            // the canonical path, sent upstream as it is
	secrets map[string][]byte // values injected by secret name (scrubbed from the response)
	names   []string
	failed  bool
	reason  string
}

// scrub1xx redacts the injected values from informational responses
// before the ReverseProxy forwards them (see redact.Trace).
type scrub1xx struct{ rt http.RoundTripper }

func (s scrub1xx) RoundTrip(r *http.Request) (*http.Response, error) {
	if st, ok := r.Context().Value(reqStateKey{}).(*reqState); ok && len(st.secrets) > 0 {
		r = r.WithContext(redact.Trace(r.Context(), st.secrets))
	}
	return s.rt.RoundTrip(r)
}

// requestPath returns the escaped path of r's request target as the
// client sent it.
func requestPath(r *http.Request) string {
	if p, _, _ := strings.Cut(r.RequestURI, "?"); strings.HasPrefix(p, "/") {
		return p
	}
	return r.URL.EscapedPath()
}

func (in *interceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := in.t
	rec := api.EgressRecord{Kind: "request", Destination: t.dest, Address: t.addr.String(), Method: r.Method, Path: r.URL.Path, Decision: api.EgressAllowed, Rule: t.dec.Rule}
	// The Host header must name the CONNECT target.
	hh, hp, err := splitPort(r.Host, t.port)
	canon, cerr := CanonicalHost(hh)
	if err != nil || cerr != nil || canon != t.host || hp != t.port {
		rec.Decision, rec.Reason, rec.Status = api.EgressDenied, "Host header is not the CONNECT target", http.StatusMisdirectedRequest
		in.f.record(rec)
		http.Error(w, "agentbox egress proxy: Host does not match the CONNECT target", http.StatusMisdirectedRequest)
		return
	}
	// Rules match the canonical path, and the upstream is sent exactly
	// that path; a path servers could read two ways is refused.
	path, err := urlpath.Canonical(requestPath(r))
	if err != nil {
		rec.Decision, rec.Reason, rec.Status = api.EgressDenied, "ambiguous request path", http.StatusBadRequest
		in.f.record(rec)
		http.Error(w, "agentbox egress proxy: ambiguous request path (encoded slash, backslash, dot segment or empty segment)", http.StatusBadRequest)
		return
	}
	rec.Path = path
	st := &reqState{path: path, secrets: map[string][]byte{}}
	// Client-supplied values of every injected header are dropped, whether
	// or not a rule applies to this method and path.
	for _, c := range in.creds {
		r.Header.Del(c.Header)
	}
	for _, c := range in.creds {
		if !c.matches(r.Method, path) {
			continue
		}
		val, err := in.f.p.secret(r.Context(), c.Secret)
		if err != nil {
			rec.Decision, rec.Reason, rec.Status = api.EgressError, "credential "+c.Secret+" unavailable", http.StatusBadGateway
			in.f.record(rec)
			http.Error(w, "agentbox egress proxy: credential "+c.Secret+" unavailable", http.StatusBadGateway)
			return
		}
		r.Header.Set(c.Header, strings.ReplaceAll(c.Format, "{secret}", string(val)))
		placeholder := api.SecretPlaceholder + c.Secret
		for k, vs := range r.Header {
			for i, v := range vs {
				if strings.Contains(v, placeholder) {
					r.Header[k][i] = strings.ReplaceAll(v, placeholder, string(val))
				}
			}
		}
		st.secrets[c.Secret] = val
		st.names = append(st.names, c.Secret)
	}
	if len(st.secrets) > 0 {
		// Ask for the body unencoded; whatever coding comes back anyway
		// is decoded before scrubbing (modifyResponse).
		r.Header.Set("Accept-Encoding", "identity")
	}
	rec.Credentials = st.names
	body := &countingReader{r: r.Body}
	r.Body = body
	cw := &countingWriter{ResponseWriter: w}
	in.rp.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), reqStateKey{}, st)))
	rec.Status, rec.BytesUp, rec.BytesDown = cw.status, body.n, cw.n
	if st.failed {
		rec.Decision, rec.Reason = api.EgressError, st.reason
	}
	in.f.record(rec)
}

func (in *interceptor) rewrite(pr *httputil.ProxyRequest) {
	host := in.t.host
	if in.t.port != 443 {
		host = net.JoinHostPort(host, strconv.Itoa(in.t.port))
	}
	pr.Out.URL.Scheme = "https"
	pr.Out.URL.Host = host
	pr.Out.Host = host
	if st, ok := pr.In.Context().Value(reqStateKey{}).(*reqState); ok {
		pr.Out.URL.Path, _ = url.PathUnescape(st.path)
		pr.Out.URL.RawPath = st.path
	}
	pr.Out.Header.Del("Proxy-Authorization")
}

// modifyResponse scrubs injected values, raw and in their common encodings
// (base64, URL escaping, hex: see internal/redact), from the response's
// headers, body (decoded from its content codings first) and trailers; an
// occurrence is replaced by redact.Replacement(name). A body in a coding
// the proxy cannot decode is refused (502). Responses to requests that
// carried no credential pass untouched.
func (in *interceptor) modifyResponse(resp *http.Response) error {
	st, _ := resp.Request.Context().Value(reqStateKey{}).(*reqState)
	if st == nil || len(st.secrets) == 0 {
		return nil
	}
	if err := redact.Response(resp, redact.New(st.secrets), contentcoding.Limits{}); err != nil {
		return fmt.Errorf("scrubbing the response: %w", err)
	}
	return nil
}

func (p *Proxy) secret(ctx context.Context, name string) ([]byte, error) {
	if p.cfg.Secrets == nil {
		return nil, fmt.Errorf("no secret store")
	}
	v, err := p.cfg.Secrets.Secret(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(v) == 0 || bytes.ContainsAny(v, "\r\n\x00") {
		return nil, fmt.Errorf("secret %s is empty or not header-safe", name)
	}
	return v, nil
}
