package egress

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
)

// mapResolver maps test names to addresses.
type mapResolver map[string]string

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	a, ok := m[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

type mapSecrets map[string]string

func (m mapSecrets) Secret(_ context.Context, name string) ([]byte, error) {
	v, ok := m[name]
	if !ok {
		return nil, errors.New("no such secret")
	}
	return []byte(v), nil
}

const realToken = "s3cr3t/REAL+token=value"

// env is a proxy with one configured sandbox, an HTTPS upstream on
// 127.0.0.2 whose certificate comes from a test CA, and a plain-HTTP one.
type env struct {
	proxy     *Proxy
	proxyURL  *url.URL
	port      int // HTTPS upstream port
	httpPort  int
	upRoots   *x509.CertPool
	sandboxCA *x509.CertPool

	mu       sync.Mutex
	lastAuth string
	lastPath string
}

func newEnv(t testing.TB, spec func(e *env) api.NetworkSpec) *env {
	return newEnvWith(t, spec, nil)
}

// newEnvWith is newEnv with a hook that adjusts the proxy's Config.
func newEnvWith(t testing.TB, spec func(e *env) api.NetworkSpec, adjust func(*Config)) *env {
	t.Helper()
	e := &env{}
	upCA, _, err := newCA("test upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	e.upRoots = x509.NewCertPool()
	e.upRoots.AddCert(upCA.cert)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.lastAuth = r.Header.Get("Authorization")
		e.lastPath = r.URL.EscapedPath()
		e.mu.Unlock()
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "host=%s auth=%s x=%s", r.Host, r.Header.Get("Authorization"), r.Header.Get("X-Token"))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://denied.test:"+strconv.Itoa(e.port)+"/", http.StatusFound)
	})
	// /coded echoes the bearer token gzip-compressed (or, with ?ce=, under
	// the coding named, sent as is), in a 103 hint and in a trailer.
	mux.HandleFunc("/coded", func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		w.Header().Set("Link", "</?"+auth+">")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Trailer", "X-Echo-Trailer")
		ce := r.URL.Query().Get("ce")
		if ce == "" {
			ce = "gzip"
		}
		w.Header().Set("Content-Encoding", ce)
		if ce == "gzip" {
			gz := gzip.NewWriter(w)
			fmt.Fprintf(gz, "auth=%s", auth)
			gz.Close()
		} else {
			fmt.Fprintf(w, "auth=%s", auth)
		}
		w.Header().Set("X-Echo-Trailer", auth)
	})
	// /encoded echoes the bearer token in encodings a client could decode.
	mux.HandleFunc("/encoded", func(w http.ResponseWriter, r *http.Request) {
		tok := []byte(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		w.Header().Set("X-Echo-B64", base64.StdEncoding.EncodeToString(tok))
		// Written byte by byte across flushes: the redactor must catch a
		// value split between reads.
		out := fmt.Sprintf("b64=%s raw64=%s url=%s path=%s hex=%s",
			base64.StdEncoding.EncodeToString(tok), base64.RawURLEncoding.EncodeToString(tok),
			url.QueryEscape(string(tok)), url.PathEscape(string(tok)), hex.EncodeToString(tok))
		f := w.(http.Flusher)
		for i := range len(out) {
			_, _ = io.WriteString(w, out[i:i+1])
			if i%7 == 0 {
				f.Flush()
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(mux)
	up.Listener.Close()
	up.Listener = ln
	up.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }}
	up.StartTLS()
	t.Cleanup(up.Close)
	e.port = ln.Addr().(*net.TCPAddr).Port

	pln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	plain := httptest.NewUnstartedServer(mux)
	plain.Listener.Close()
	plain.Listener = pln
	plain.Start()
	t.Cleanup(plain.Close)
	e.httpPort = pln.Addr().(*net.TCPAddr).Port

	cfg := Config{
		Resolver: mapResolver{
			"api.good.test": "127.0.0.2", "tunnel.good.test": "127.0.0.2", "a.wild.test": "127.0.0.2", "wild.test": "127.0.0.2",
			"good.test.evil.test": "127.0.0.2", "evilgood.test": "127.0.0.2", "denied.test": "127.0.0.2",
			"loop.good.test": "127.0.0.1", "meta.good.test": "169.254.169.254", "plain.good.test": "127.0.0.2",
		},
		Secrets: mapSecrets{"gh": realToken},
		RootCAs: e.upRoots,
		Permit:  []*Rule{mustPermit(t, "127.0.0.2/32")},
		Logger:  testLogger(),
		RunOf:   func(_ context.Context, id string) string { return "run_of_" + id },
	}
	if adjust != nil {
		adjust(&cfg)
	}
	e.proxy = New(cfg)
	caPEM, err := e.proxy.Configure("sb1", t.TempDir(), spec(e))
	if err != nil {
		t.Fatal(err)
	}
	e.sandboxCA = x509.NewCertPool()
	if !e.sandboxCA.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	e.sandboxCA.AddCert(upCA.cert) // tunnelled destinations present the upstream's own certificate

	fln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fln.Close() })
	go func() {
		for {
			c, err := fln.Accept()
			if err != nil {
				return
			}
			go e.proxy.ServeConn(context.Background(), "sb1", c)
		}
	}()
	e.proxyURL = &url.URL{Scheme: "http", Host: fln.Addr().String()}
	return e
}

func defaultSpec(e *env) api.NetworkSpec {
	p := strconv.Itoa(e.port)
	return api.NetworkSpec{
		Mode: api.NetworkEgress,
		Allow: []string{"tunnel.good.test:" + p, "*.wild.test:" + p, "loop.good.test:" + p, "meta.good.test:" + p,
			"plain.good.test:" + strconv.Itoa(e.httpPort), "denied.test:*"},
		Deny:        []string{"denied.test"},
		Credentials: []api.CredentialRule{{Secret: "gh", Host: "api.good.test", Port: e.port}},
	}
}

func (e *env) client(follow bool) *http.Client {
	c := &http.Client{
		Transport: &http.Transport{Proxy: http.ProxyURL(e.proxyURL), TLSClientConfig: &tls.Config{RootCAs: e.sandboxCA}},
		Timeout:   10 * time.Second,
	}
	if !follow {
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	return c
}

func (e *env) get(t *testing.T, rawURL string, hdr map[string]string) (*http.Response, string, error) {
	t.Helper()
	req, _ := http.NewRequest("GET", rawURL, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := e.client(false)
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

// connect sends a raw CONNECT and returns the status code.
func (e *env) connect(t *testing.T, target string) int {
	t.Helper()
	c, err := net.Dial("tcp", e.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

func TestPolicyDecisions(t *testing.T) {
	e := newEnv(t, defaultSpec)
	p := strconv.Itoa(e.port)
	for _, tc := range []struct {
		target string
		want   int
	}{
		{"tunnel.good.test:" + p, 200},
		{"TUNNEL.Good.Test.:" + p, 200}, // case and trailing dot canonicalised
		{"a.wild.test:" + p, 200},
		{"wild.test:" + p, 403},           // wildcard does not match the apex
		{"good.test.evil.test:" + p, 403}, // suffix trick
		{"evilgood.test:" + p, 403},       // suffix trick
		{"tunnel.good.test:1", 403},       // allowed host, other port
		{"denied.test:" + p, 403},         // deny wins over allow
		{"loop.good.test:" + p, 403},      // allowed name resolving to loopback
		{"meta.good.test:" + p, 403},      // allowed name resolving to metadata
		{"127.0.0.2:" + p, 403},           // raw IP without an IP rule
		{"2130706433:" + p, 403},          // decimal IP form
		{"0x7f000002:" + p, 403},          // hex IP form
		{"127.2:" + p, 403},               // short IP form
		{"0177.0.0.2:" + p, 403},          // octal IP form
		{"[::ffff:127.0.0.2]:" + p, 403},  // mapped IPv6
		{"unknown.test:" + p, 403},        // not allowed at all
	} {
		if got := e.connect(t, tc.target); got != tc.want {
			t.Errorf("CONNECT %s: %d, want %d", tc.target, got, tc.want)
		}
	}
	recs := e.proxy.Records("sb1", 0)
	if len(recs) == 0 {
		t.Fatal("no records")
	}
	var denied int
	for _, r := range recs {
		if r.Decision == api.EgressDenied {
			denied++
		}
	}
	if denied < 10 {
		t.Errorf("only %d denied records: %+v", denied, recs)
	}
}

func mustPermit(t testing.TB, s string) *Rule {
	t.Helper()
	r, err := ParsePermit(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSandboxRulesDoNotLiftInternalBan: an allow rule naming an internal
// address is refused by Validate unless the daemon permits it, and a
// policy recorded with one (re-adopted after an upgrade) reaches nothing
// internal.
func TestSandboxRulesDoNotLiftInternalBan(t *testing.T) {
	internal := func(e *env) api.NetworkSpec {
		return api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"127.0.0.1:*", "loop.good.test:*", "0.0.0.0/0:*", "::/0"}}
	}
	e := newEnv(t, internal)
	if err := e.proxy.Validate(internal(e)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Validate of rules naming loopback: %v", err)
	}
	p := strconv.Itoa(e.port)
	for _, target := range []string{"loop.good.test:" + p, "127.0.0.1:" + p, "[::ffff:127.0.0.1]:" + p, "0.0.0.0:" + p, "[::]:" + p} {
		if got := e.connect(t, target); got != 403 {
			t.Errorf("CONNECT %s under a recorded internal rule: %d, want 403", target, got)
		}
	}
}

func TestValidateInternalRules(t *testing.T) {
	pr := New(Config{Permit: []*Rule{mustPermit(t, "127.0.0.2/32"), mustPermit(t, "10.1.0.0/16:443"), mustPermit(t, "[fd00::/64]:*")}, Logger: testLogger()})
	ok := []string{"example.com", "*.example.com:*", "8.8.8.8:53", "2001:4860::/32", "127.0.0.2:*", "127.0.0.2", "10.1.2.3:443", "10.1.0.0/16:443",
		"[fd00::1]:80", "fd00::/64", "1.0.0.0/8:*"}
	bad := []string{"127.0.0.1", "127.0.0.0/8:*", "0.0.0.0/0:*", "::/0", "[::1]:*", "169.254.169.254", "10.0.0.0/8:*", "10.1.2.3:80",
		"10.1.2.3:*", "10.1.2.3", "100.64.0.1:443", "[fd00:1::1]:443", "fc00::/7", "192.168.1.1", "[::ffff:127.0.0.1]:80", "::ffff:0:0/96",
		"::ffff:7f00:0/104", "0.0.0.0", "224.0.0.1", "[fe80::1]:80", "127.0.0.2/31:*", "localhost", "*.localhost", "a.localhost:*",
		"64:ff9b::7f00:1", "[::7f00:1]:80"}
	for _, r := range ok {
		if err := pr.Validate(api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{r}}); err != nil {
			t.Errorf("allow %q: %v", r, err)
		}
	}
	for _, r := range bad {
		err := pr.Validate(api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{r}})
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("allow %q: %v, want invalid argument", r, err)
		}
	}
	// Deny rules may name anything.
	if err := pr.Validate(api.NetworkSpec{Mode: api.NetworkEgress, Deny: []string{"0.0.0.0/0:*", "127.0.0.1", "localhost"}}); err != nil {
		t.Errorf("deny rules: %v", err)
	}
}

// TestSelfListenerNeverDialled: the daemon's own TCP port is refused on
// every local address even where the permit list covers loopback.
func TestSelfListenerNeverDialled(t *testing.T) {
	// e's upstream port stands in for the daemon's listener of e2.
	e := newEnv(t, defaultSpec)
	e2 := newEnvWith(t, func(*env) api.NetworkSpec {
		return api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"127.0.0.0/8:*", "loop.good.test:*"}}
	}, func(c *Config) {
		c.Permit = []*Rule{mustPermit(t, "127.0.0.0/8")}
		c.SelfPorts = []int{e.port}
	})
	for _, target := range []string{"127.0.0.1:" + strconv.Itoa(e.port), "127.0.0.2:" + strconv.Itoa(e.port), "loop.good.test:" + strconv.Itoa(e.port)} {
		if got := e2.connect(t, target); got != 403 {
			t.Errorf("CONNECT %s (the daemon's port): %d, want 403", target, got)
		}
	}
	// Control: permitted loopback on another port is dialled.
	if got := e2.connect(t, "127.0.0.2:"+strconv.Itoa(e2.port)); got != 200 {
		t.Errorf("CONNECT permitted loopback: %d, want 200", got)
	}
}

func TestModeNoneDeniesEverything(t *testing.T) {
	e := newEnv(t, func(e *env) api.NetworkSpec {
		s := defaultSpec(e)
		s.Mode = api.NetworkNone
		return s
	})
	if got := e.connect(t, "tunnel.good.test:"+strconv.Itoa(e.port)); got != 403 {
		t.Fatalf("mode none: %d", got)
	}
}

func TestTunnelAndPlainHTTP(t *testing.T) {
	e := newEnv(t, defaultSpec)
	resp, body, err := e.get(t, "https://tunnel.good.test:"+strconv.Itoa(e.port)+"/x", map[string]string{"Authorization": "Bearer mine"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.Contains(body, "auth=Bearer mine") {
		t.Fatalf("tunnelled request: %d %q", resp.StatusCode, body)
	}
	if resp.TLS.PeerCertificates[0].Issuer.CommonName != "test upstream CA" {
		t.Fatalf("tunnelled destination was intercepted: issuer %q", resp.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	resp, body, err = e.get(t, "http://plain.good.test:"+strconv.Itoa(e.httpPort)+"/p", nil)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(body, "host=plain.good.test") {
		t.Fatalf("plain http: %v %v %q", err, resp, body)
	}
	resp, _, err = e.get(t, "http://unknown.test:"+strconv.Itoa(e.httpPort)+"/p", nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("plain http to unknown host: %v %v", err, resp)
	}
	// The tunnel's record is written when it ends.
	var kinds []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		kinds = nil
		for _, r := range e.proxy.Records("sb1", 0) {
			kinds = append(kinds, r.Kind+"/"+r.Decision)
			if r.Kind == "connect" && r.Decision == api.EgressAllowed && (r.BytesUp == 0 || r.BytesDown == 0) {
				t.Errorf("tunnel record without byte counts: %+v", r)
			}
		}
		slices.Sort(kinds)
		if len(kinds) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := []string{"connect/allowed", "http/allowed", "http/denied"}
	if strings.Join(kinds, ",") != strings.Join(want, ",") {
		t.Errorf("records %v, want %v", kinds, want)
	}
}

func TestCredentialInjectionAndScrubbing(t *testing.T) {
	e := newEnv(t, defaultSpec)
	u := "https://api.good.test:" + strconv.Itoa(e.port) + "/repos"
	resp, body, err := e.get(t, u, map[string]string{"Authorization": "Bearer client-supplied", "X-Token": api.SecretPlaceholder + "gh"})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	got := e.lastAuth
	e.mu.Unlock()
	if got != "Bearer "+realToken {
		t.Fatalf("upstream got Authorization %q", got)
	}
	if resp.TLS.PeerCertificates[0].Issuer.CommonName == "test upstream CA" {
		t.Fatal("credential destination was not intercepted")
	}
	if strings.Contains(body, realToken) || strings.Contains(strings.Join(resp.Header.Values("X-Echo-Auth"), ""), realToken) {
		t.Fatalf("secret echoed back to the sandbox: %q %v", body, resp.Header)
	}
	if red := redact.Replacement("gh"); !strings.Contains(body, "auth=Bearer "+red) || !strings.Contains(body, "x="+red) || strings.Contains(body, "client-supplied") {
		t.Fatalf("body %q", body)
	}
	// Encoded echoes are scrubbed too, even split across reads.
	eresp, ebody, err := e.get(t, "https://api.good.test:"+strconv.Itoa(e.port)+"/encoded", nil)
	if err != nil {
		t.Fatal(err)
	}
	red := redact.Replacement("gh")
	if want := "b64=" + red + " raw64=" + red + " url=" + red + " path=" + red + " hex=" + red; ebody != want || eresp.Header.Get("X-Echo-B64") != red {
		t.Fatalf("encoded echo reached the sandbox: %q (header %q)", ebody, eresp.Header.Get("X-Echo-B64"))
	}
	recs := e.proxy.Records("sb1", 0)
	var req *api.EgressRecord
	for i := range recs {
		if recs[i].Kind == "request" && recs[i].Path == "/repos" {
			req = &recs[i]
		}
		if strings.Contains(fmt.Sprintf("%+v", recs[i]), realToken) {
			t.Fatalf("record holds the secret: %+v", recs[i])
		}
	}
	if req == nil || len(req.Credentials) != 1 || req.Credentials[0] != "gh" || req.Path != "/repos" || req.Status != 200 || req.RunID != "run_of_sb1" {
		t.Fatalf("request record %+v", req)
	}

	// Several requests over one intercepted tunnel (keep-alive).
	kc := e.client(false)
	defer kc.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		resp, err := kc.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("keep-alive request %d: %d", i, resp.StatusCode)
		}
	}

	// A redirect is passed through, not followed; following it to a
	// denied origin fails at the proxy.
	resp, _, err = e.get(t, "https://api.good.test:"+strconv.Itoa(e.port)+"/redirect", nil)
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("redirect: %v %v", err, resp)
	}
	if _, err := e.client(true).Get("https://api.good.test:" + strconv.Itoa(e.port) + "/redirect"); err == nil {
		t.Fatal("redirect to a denied origin was followed")
	}
}

func TestHostAndSNIMustMatchConnect(t *testing.T) {
	e := newEnv(t, defaultSpec)
	dest := "api.good.test:" + strconv.Itoa(e.port)
	// Host header naming another origin inside the intercepted tunnel.
	c, err := net.Dial("tcp", e.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", err, resp)
	}
	tc := tls.Client(&bufConn{Conn: c, r: br}, &tls.Config{ServerName: "api.good.test", RootCAs: e.sandboxCA})
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: tunnel.good.test:%d\r\n\r\n", e.port)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("Host mismatch: %v %v", err, resp)
	}
	e.mu.Lock()
	if e.lastAuth != "" {
		t.Fatal("request with a mismatched Host reached the upstream")
	}
	e.mu.Unlock()

	// SNI naming another host.
	c2, err := net.Dial("tcp", e.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br2 := bufio.NewReader(c2)
	if resp, err := http.ReadResponse(br2, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", err, resp)
	}
	tc2 := tls.Client(&bufConn{Conn: c2, r: br2}, &tls.Config{ServerName: "tunnel.good.test", InsecureSkipVerify: true})
	if err := tc2.Handshake(); err == nil {
		t.Fatal("handshake with a mismatched SNI succeeded")
	}
}

func TestUpstreamCertificateIsVerified(t *testing.T) {
	e := newEnv(t, defaultSpec)
	e.proxy.cfg.RootCAs = x509.NewCertPool() // the upstream's CA is not trusted
	resp, _, err := e.get(t, "https://api.good.test:"+strconv.Itoa(e.port)+"/", nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("untrusted upstream: %v %v", err, resp)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastAuth != "" {
		t.Fatal("credential sent to an unverified upstream")
	}
}

func TestParsePolicyRejects(t *testing.T) {
	for _, s := range []api.NetworkSpec{
		{Mode: "bridge"},
		{Mode: api.NetworkEgress, Allow: []string{"exa mple.com"}},
		{Mode: api.NetworkEgress, Allow: []string{"example.com:0"}},
		{Mode: api.NetworkEgress, Allow: []string{"*.1.2.3.4"}},
		{Mode: api.NetworkEgress, Credentials: []api.CredentialRule{{Secret: "x", Host: "1.2.3.4"}}},
		{Mode: api.NetworkEgress, Credentials: []api.CredentialRule{{Secret: "x", Host: "a.test", Format: "no placeholder"}}},
		{Mode: api.NetworkEgress, Credentials: []api.CredentialRule{{Secret: "x", Host: "a.test", Header: "Bad Header"}}},
	} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("accepted %+v", s)
		}
	}
	for in, want := range map[string]string{"ExAmple.COM.": "example.com", "bücher.example": "xn--bcher-kva.example"} {
		if got, err := CanonicalHost(in); err != nil || got != want {
			t.Errorf("CanonicalHost(%q) = %q, %v", in, got, err)
		}
	}
}

// testLogger discards the log unless EGRESS_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("EGRESS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestCredentialPathScopeCanonical: path_prefix matches the canonical path
// on segment boundaries, ambiguous paths are refused, and the upstream
// gets exactly the canonical path.
func TestCredentialPathScopeCanonical(t *testing.T) {
	e := newEnv(t, func(e *env) api.NetworkSpec {
		s := defaultSpec(e)
		s.Credentials[0].PathPrefix = "/allowed"
		return s
	})
	c := e.client(false)
	defer c.CloseIdleConnections()
	for _, tc := range []struct {
		target, upstream string
		status           int
		inject           bool
	}{
		{"/allowed", "/allowed", 200, true},
		{"/allowed/sub", "/allowed/sub", 200, true},
		{"/allow%65d/./sub", "/allowed/sub", 200, true},
		{"/allowedEXTRA", "/allowedEXTRA", 200, false},
		{"/allowed/../x", "/x", 200, false},
		{"/a%2a", "/a%2A", 200, false},
		{"/allowed/%2e%2e/x", "", 400, false},
		{"/allowed%2fx", "", 400, false},
		{"//allowed", "", 421, false}, // Go sends this opaque form as https://allowed: another host
		{"/allowed/..;/x", "", 400, false},
		{"/allowed\\..\\x", "", 400, false},
	} {
		e.mu.Lock()
		e.lastAuth, e.lastPath = "", ""
		e.mu.Unlock()
		req, _ := http.NewRequest("GET", "https://api.good.test:"+strconv.Itoa(e.port)+"/", nil)
		req.URL.Opaque = tc.target
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.target, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		e.mu.Lock()
		auth, path := e.lastAuth, e.lastPath
		e.mu.Unlock()
		if resp.StatusCode != tc.status || path != tc.upstream || (auth == "Bearer "+realToken) != tc.inject {
			t.Errorf("%s: status %d, upstream path %q, injected %v; want %d %q %v", tc.target, resp.StatusCode, path, auth != "", tc.status, tc.upstream, tc.inject)
		}
	}
	if _, err := ParsePolicy(api.NetworkSpec{Mode: api.NetworkEgress, Credentials: []api.CredentialRule{{Secret: "gh", Host: "a.test", PathPrefix: "/a/%2e%2e/b"}}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ambiguous path_prefix: %v", err)
	}
}

// TestScrubbingSurvivesContentCodings: an upstream that compresses its
// echo of the injected credential although asked for identity, and echoes
// it in a 1xx response and a trailer, still leaks nothing; a coding the
// proxy cannot decode is refused.
func TestScrubbingSurvivesContentCodings(t *testing.T) {
	e := newEnv(t, defaultSpec)
	c := e.client(false)
	c.Transport.(*http.Transport).DisableCompression = true
	defer c.CloseIdleConnections()
	var hints []string
	get := func(u string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Accept-Encoding", "gzip")
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			Got1xxResponse: func(_ int, h textproto.MIMEHeader) error { hints = append(hints, h.Get("Link")); return nil },
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	base := "https://api.good.test:" + strconv.Itoa(e.port)
	resp, body := get(base + "/coded")
	red := redact.Replacement("gh")
	if resp.StatusCode != 200 || body != "auth=Bearer "+red || resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("gzip echo: %d %q (Content-Encoding %q)", resp.StatusCode, body, resp.Header.Get("Content-Encoding"))
	}
	if tr := resp.Trailer.Get("X-Echo-Trailer"); tr != "Bearer "+red {
		t.Errorf("trailer %q", tr)
	}
	if len(hints) != 1 || strings.Contains(hints[0], realToken) {
		t.Errorf("1xx hints %q", hints)
	}
	resp, body = get(base + "/coded?ce=x-private")
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, realToken) {
		t.Errorf("unknown coding: %d %q", resp.StatusCode, body)
	}
}
