package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/testutil/codingtest"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// rawgetSrc is a static client uploaded into sandboxes that shows what a
// program inside receives, undecoded: the status, every 1xx response's
// headers, the headers, the body in base64 (whatever its coding) and the
// trailers. "RAW:/path" sends /path as the request target verbatim.
const rawgetSrc = `package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"strings"
)

func main() {
	req, err := http.NewRequest("GET", os.Args[1], nil)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	for _, h := range os.Args[2:] {
		k, v, _ := strings.Cut(h, ":")
		if k == "RAW" {
			req.URL.Opaque = v
			continue
		}
		req.Header.Set(k, v)
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			for k, vs := range h {
				fmt.Printf("1XX %d %s: %s\n", code, k, strings.Join(vs, ","))
			}
			return nil
		},
	}))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableCompression = true
	resp, err := tr.RoundTrip(req)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("STATUS %d\n", resp.StatusCode)
	for k, vs := range resp.Header {
		fmt.Printf("HDR %s: %s\n", k, strings.Join(vs, ","))
	}
	fmt.Printf("BODY %s\n", base64.StdEncoding.EncodeToString(b))
	for k, vs := range resp.Trailer {
		fmt.Printf("TRL %s: %s\n", k, strings.Join(vs, ","))
	}
}
`

// rawResult is rawget's output, parsed.
type rawResult struct {
	status int
	text   string // everything but the body
	body   []byte
}

func parseRawget(out string) rawResult {
	var r rawResult
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "STATUS "):
			r.status, _ = strconv.Atoi(strings.TrimPrefix(line, "STATUS "))
		case strings.HasPrefix(line, "BODY "):
			r.body, _ = base64.StdEncoding.DecodeString(strings.TrimPrefix(line, "BODY "))
		default:
			r.text += line + "\n"
		}
	}
	return r
}

// leaks reports where secret (raw or in an encoding the redactor knows)
// shows in what a sandbox received.
func leaks(res rawResult, codings []string, secret string) string {
	red := redact.New(map[string][]byte{"s": []byte(secret)})
	var where []string
	for _, line := range strings.Split(res.text, "\n") {
		if red.RedactString(line) != line {
			where = append(where, "header line "+strconv.Quote(line))
		}
	}
	for i, form := range codingtest.Decode(res.body, codings...) {
		if red.RedactString(string(form)) != string(form) {
			where = append(where, fmt.Sprintf("body (%d codings undone of %q): %.120q", i, codings, form))
		}
	}
	return strings.Join(where, "; ")
}

// hostileHandler echoes the Authorization header it gets in every channel
// a response has: a 103 Early Hints header, a response header, the body
// under the content codings named by the ce query parameter (comma
// separated, applied in order), and a trailer.
func hostileHandler(t *testing.T, seen *pathLog) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		seen.add(r.URL.EscapedPath(), auth)
		var codings []string
		if ce := r.URL.Query().Get("ce"); ce != "" {
			codings = strings.Split(ce, ",")
		}
		if r.URL.Query().Get("hint") != "" {
			w.Header().Set("Link", "</x?"+auth+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
		}
		body := []byte(strings.Repeat("padding ", 64) + "auth=" + auth + " path=" + r.URL.EscapedPath() + "\n")
		w.Header().Set("Trailer", "X-Echo-Trailer")
		if len(codings) > 0 {
			// raw-deflate is "deflate" without the zlib wrapper, as some
			// servers send it.
			wire := strings.ReplaceAll(strings.Join(codings, ", "), "raw-deflate", "deflate")
			w.Header().Set("Content-Encoding", wire)
			body = codingtest.Encode(t, body, codings...)
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
		w.Header().Set("X-Echo-Trailer", auth)
	}
}

// pathLog records the path and Authorization of each upstream request.
type pathLog struct {
	mu   sync.Mutex
	reqs [][2]string
}

func (l *pathLog) add(path, auth string) {
	l.mu.Lock()
	l.reqs = append(l.reqs, [2]string{path, auth})
	l.mu.Unlock()
}

func (l *pathLog) take() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reqs
	l.reqs = nil
	return r
}

// hostileUpstreams starts the TLS and plain hostile upstreams on 127.0.0.2
// (the test CA from startUpstreams signs the TLS one) and returns their
// ports.
func hostileUpstreams(t *testing.T, dir string, h http.Handler) (tlsPort, httpPort int) {
	t.Helper()
	ca, err := egress.LoadOrCreateCA(dir, "integration upstream CA") // startUpstreams's
	if err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = listen()
	s.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }}
	s.StartTLS()
	t.Cleanup(s.Close)
	p := httptest.NewUnstartedServer(h)
	p.Listener.Close()
	p.Listener = listen()
	p.Start()
	t.Cleanup(p.Close)
	return s.Listener.Addr().(*net.TCPAddr).Port, p.Listener.Addr().(*net.TCPAddr).Port
}

// TestAdversarialEgressTenantInternalRules: a tenant (its own API key over
// TCP) cannot write allow rules that name loopback, link-local, private,
// CGNAT or ULA addresses, or everything; not at create and not at policy
// update. The admin may name only what the daemon's configuration permits.
func TestAdversarialEgressTenantInternalRules(t *testing.T) {
	dir := t.TempDir()
	startUpstreams(t, dir) // AGENTBOX_EGRESS_PERMIT=127.0.0.2/32
	d, base := tenancyDaemon(t)
	_, key := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)

	bad := [][]string{
		{"127.0.0.0/8:*", "0.0.0.0/0:*", "[::1]:*", "169.254.169.254", "10.0.0.0/8:*"},
		{"127.0.0.1:*"}, {"0.0.0.0/0:*"}, {"[::1]:*"}, {"169.254.169.254"}, {"10.0.0.0/8:*"},
		{"100.64.0.1:443"}, {"[fd00::1]:443"}, {"192.168.1.1"}, {"172.16.0.0/12"}, {"[::ffff:127.0.0.1]:80"},
		{"::ffff:0:0/96"}, {"::ffff:7f00:0/104"}, {"::/0"}, {"0.0.0.0"}, {"224.0.0.1"}, {"[fe80::1]:80"}, {"127.0.0.2/31:*"},
		{"localhost:*"}, {"*.localhost"}, {"127.0.0.2:*", "127.0.0.3:*"},
	}
	spec := func(allow []string) []byte {
		b, _ := json.Marshal(map[string]any{"network": api.NetworkSpec{Mode: api.NetworkEgress, Allow: allow}})
		return b
	}
	for _, allow := range bad {
		code, _, body := rawCall(t, base, key.Key, "POST", "/v1/sandboxes", spec(allow))
		if code != http.StatusBadRequest {
			t.Errorf("tenant create with allow %q: %d %s (want 400)", allow, code, body)
			var sb api.Sandbox
			if json.Unmarshal(body, &sb) == nil && sb.ID != "" {
				rawCall(t, base, key.Key, "DELETE", "/v1/sandboxes/"+sb.ID+"?force=true", nil)
			}
		} else if !strings.Contains(string(body), "internal") && !strings.Contains(string(body), "localhost") {
			t.Errorf("tenant create with allow %q: 400 without a clear message: %s", allow, body)
		}
	}
	// A legal policy, then updates naming internal addresses.
	code, _, body := rawCall(t, base, key.Key, "POST", "/v1/sandboxes", spec([]string{"good.test:*", "127.0.0.2:*"}))
	if code != http.StatusCreated {
		t.Fatalf("tenant create with a legal policy (a name, an admin-permitted address): %d %s", code, body)
	}
	var sb api.Sandbox
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	for _, allow := range bad {
		upd, _ := json.Marshal(api.NetworkSpec{Mode: api.NetworkEgress, Allow: allow})
		if code, _, body := rawCall(t, base, key.Key, "PUT", "/v1/sandboxes/"+sb.ID+"/network", upd); code != http.StatusBadRequest {
			t.Errorf("tenant policy update with allow %q: %d %s (want 400)", allow, code, body)
		}
	}
	// Deny rules may name anything.
	upd, _ := json.Marshal(api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"good.test"}, Deny: []string{"0.0.0.0/0:*", "127.0.0.1"}})
	if code, _, body := rawCall(t, base, key.Key, "PUT", "/v1/sandboxes/"+sb.ID+"/network", upd); code != http.StatusOK {
		t.Errorf("deny rules naming internal ranges: %d %s", code, body)
	}
	// The admin (unix socket) is bound by the daemon's configuration too.
	adminSpec := func(allow ...string) agentbox.SandboxSpec {
		return agentbox.SandboxSpec{Network: &api.NetworkSpec{Mode: api.NetworkEgress, Allow: allow}}
	}
	ctx := context.Background()
	if sb, err := d.client.Create(ctx, adminSpec("127.0.0.1:*")); err == nil {
		_ = sb.Delete(ctx)
		t.Errorf("admin create naming unpermitted loopback succeeded")
	} else if !agentbox.IsInvalidArgument(err) {
		t.Errorf("admin create naming unpermitted loopback: %v (want invalid argument)", err)
	}
	if sb, err := d.client.Create(ctx, adminSpec("127.0.0.2:*")); err != nil {
		t.Errorf("admin create naming a permitted address: %v", err)
	} else {
		_ = sb.Delete(ctx)
	}
}

// TestAdversarialEgressInternalUnreachable: from inside a sandbox with the
// most permissive policy the daemon accepts, nothing internal that the
// daemon's configuration does not permit is reachable through the proxy:
// not the daemon's own TCP API, not a loopback service, not ::1, not a name
// resolving to loopback, in CONNECT or absolute-form requests.
func TestAdversarialEgressInternalUnreachable(t *testing.T) {
	dir := t.TempDir()
	startUpstreams(t, dir) // permit 127.0.0.2/32 only
	// A loopback service the sandbox must not reach.
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "LOOPBACK-SERVICE-REACHED") }))
	defer svc.Close()
	svcPort := strconv.Itoa(svc.Listener.Addr().(*net.TCPAddr).Port)
	var v6Port string
	if ln, err := net.Listen("tcp", "[::1]:0"); err == nil {
		v6 := httptest.NewUnstartedServer(svc.Config.Handler)
		v6.Listener.Close()
		v6.Listener = ln
		v6.Start()
		defer v6.Close()
		v6Port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	d, base := tenancyDaemon(t)
	_, daemonPort, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	tc, _ := tenantClient(t, d, base, "acme", api.Quotas{}, api.ScopeFull)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The attacker asks for everything; on a daemon that refuses that, for
	// the most it accepts.
	attack := []string{"127.0.0.0/8:*", "0.0.0.0/0:*", "[::1]:*", "169.254.169.254", "10.0.0.0/8:*", "loop.good.test:*", "*.good.test:*"}
	sb, err := tc.Create(ctx, agentbox.SandboxSpec{Network: &api.NetworkSpec{Mode: api.NetworkEgress, Allow: attack}})
	if err != nil {
		t.Logf("create with internal rules refused (%v); using the legal maximum", err)
		sb, err = tc.Create(ctx, agentbox.SandboxSpec{Network: &api.NetworkSpec{Mode: api.NetworkEgress,
			Allow: []string{"loop.good.test:*", "*.good.test:*", "good.test:*", "127.0.0.2:*"}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = sb.Delete(context.WithoutCancel(ctx)) }()

	// Each destination through the proxy, CONNECT and absolute form; the
	// proxy's own refusal names itself.
	type probe struct{ name, dest string }
	probes := []probe{
		{"daemon TCP API", "127.0.0.1:" + daemonPort},
		{"daemon TCP API via 127.0.0.2", "127.0.0.2:" + daemonPort},
		{"loopback service", "127.0.0.1:" + svcPort},
		{"loopback service by name", "loop.good.test:" + svcPort},
		{"loopback service via another loopback address", "127.9.9.9:" + svcPort},
		{"mapped loopback", "[::ffff:127.0.0.1]:" + svcPort},
	}
	if v6Port != "" {
		probes = append(probes, probe{"::1 service", "[::1]:" + v6Port})
	}
	for _, p := range probes {
		for _, form := range []string{"CONNECT", "GET"} {
			req := fmt.Sprintf(`CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\n\r\nGET /v1/health HTTP/1.1\r\nHost: %[1]s\r\nConnection: close\r\n\r\n`, p.dest)
			if form == "GET" {
				req = fmt.Sprintf(`GET http://%[1]s/v1/health HTTP/1.1\r\nHost: %[1]s\r\nConnection: close\r\n\r\n`, p.dest)
			}
			// stdin stays open a moment: a half-close would make the
			// proxy cancel the request before it dials.
			res := run(t, sb, `(printf '`+req+`'; sleep 2) | timeout 10 nc 127.0.0.1 3128`)
			out := string(res.Stdout)
			if strings.Contains(out, "LOOPBACK-SERVICE-REACHED") || strings.Contains(out, "200 Connection established") ||
				!strings.Contains(out, "agentbox egress proxy") {
				t.Errorf("%s (%s %s) from inside reached it: %.300q", p.name, form, p.dest, out)
			}
		}
	}
	recs, err := sb.EgressLog(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Decision == api.EgressAllowed {
			t.Errorf("egress record allowed: %+v", r)
		}
	}
}

// credentialDaemon starts a daemon with the hostile upstreams, the secret
// "gh" and a sandbox whose credential rule injects it for api.good.test
// on the TLS upstream's port under pathPrefix. It returns the sandbox,
// the upstream's request log and its ports.
func credentialDaemon(t *testing.T, pathPrefix string) (*agentbox.Sandbox, *pathLog, int, int) {
	t.Helper()
	dir := t.TempDir()
	startUpstreams(t, dir)
	seen := &pathLog{}
	tlsPort, httpPort := hostileUpstreams(t, dir, hostileHandler(t, seen))
	raw := buildStatic(t, dir, "rawget", rawgetSrc)
	d := newDaemon(t)
	if code, body := d.rawRequest(t, "PUT", "/v1/secrets/gh", []byte(egressSecret)); code != 200 {
		t.Fatalf("storing secret: %d %s", code, body)
	}
	sb := d.create(t, agentbox.SandboxSpec{Network: &api.NetworkSpec{
		Mode:        api.NetworkEgress,
		Allow:       []string{"good.test:*"},
		Credentials: []api.CredentialRule{{Secret: "gh", Host: "api.good.test", Port: tlsPort, PathPrefix: pathPrefix}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sb.WriteFile(ctx, "/usr/local/bin/rawget", raw, 0o755); err != nil {
		t.Fatal(err)
	}
	return sb, seen, tlsPort, httpPort
}

// TestAdversarialEgressEncodedEcho: a hostile upstream of an intercepted
// destination echoes the injected credential under every content coding
// (gzip, deflate, br, zstd, stacked, unknown), in a 103 Early Hints header
// and in a trailer, whatever the client asked for; the sandbox never sees
// it. Known codings are decoded and scrubbed; an unknown one is refused.
func TestAdversarialEgressEncodedEcho(t *testing.T) {
	sb, seen, tlsPort, _ := credentialDaemon(t, "")
	url := "https://api.good.test:" + strconv.Itoa(tlsPort) + "/echo?hint=1&ce="
	for _, ce := range []string{"", "gzip", "deflate", "raw-deflate", "br", "zstd", "gzip,br", "zstd,gzip,deflate", "x-unknown", "gzip,x-unknown"} {
		for _, ae := range []string{"", "Accept-Encoding:gzip, deflate, br, zstd"} {
			cmd := "rawget '" + url + ce + "'"
			if ae != "" {
				cmd += " '" + ae + "'"
			}
			res := parseRawget(string(run(t, sb, cmd).Stdout))
			got := seen.take()
			if len(got) != 1 || got[0][1] != "Bearer "+egressSecret {
				t.Fatalf("ce=%s: upstream saw %q (want the injected credential once)", ce, got)
			}
			codings := strings.Split(ce, ",")
			if where := leaks(res, codings, egressSecret); where != "" {
				t.Errorf("ce=%s %s: the secret reached the sandbox: %s", ce, ae, where)
				continue
			}
			unknown := strings.Contains(ce, "x-unknown")
			switch {
			case unknown && res.status != http.StatusBadGateway:
				t.Errorf("ce=%s: status %d for an undecodable coding (want 502)", ce, res.status)
			case !unknown && (res.status != http.StatusOK || !bytes.Contains(res.body, []byte("auth=Bearer "+redact.Replacement("gh")))):
				t.Errorf("ce=%s: status %d body %.200q (want 200 and the scrubbed echo, decoded)", ce, res.status, res.body)
			}
		}
	}
}

// TestAdversarialEgressPathScope: a credential rule with path_prefix
// /allowed injects for /allowed and below it on segment boundaries of the
// path the upstream sees, and for nothing that merely starts with the same
// characters or escapes it with dot segments or encodings.
func TestAdversarialEgressPathScope(t *testing.T) {
	sb, seen, tlsPort, _ := credentialDaemon(t, "/allowed")
	base := "https://api.good.test:" + strconv.Itoa(tlsPort)
	for _, c := range []struct {
		target string
		inject bool
	}{
		{"/allowed", true},
		{"/allowed/sub", true},
		{"/allowed/", true},
		{"/allowed?q=1", true},
		{"/allow%65d/sub", true}, // an encoded unreserved character is the same path
		{"/allowed/./sub", true},
		{"/allowedEXTRA", false},
		{"/allowed/../x", false},
		{"/allowed/%2e%2e/x", false},
		{"/allowed/%2E%2E/x", false},
		{"/allowed/.%2e/x", false},
		{"//allowed", false},    // (Go's client sends this as absolute-form https://allowed: another host)
		{"ABS//allowed", false}, // absolute-form request target with path //allowed
		{"ABS/allowedEXTRA", false},
		{"ABS/allowed/sub", true},
		{"/allowed%2fx", false},
		{"/allowed%2Fx", false},
		{"/allowed\\..\\x", false},
		{"/allowed/..;/x", false},
		{"/allowed%00x", false},
		{"/x/../allowed/../y", false},
		{"/other", false},
	} {
		target := c.target
		if rest, ok := strings.CutPrefix(target, "ABS"); ok {
			target = base + rest
		}
		res := parseRawget(string(run(t, sb, "rawget '"+base+"/' 'RAW:"+target+"'").Stdout))
		got := seen.take()
		injected := false
		for _, g := range got {
			if g[1] == "Bearer "+egressSecret {
				injected = true
				if c.inject && !strings.HasPrefix(g[0], "/allowed") {
					t.Errorf("%s: injected, but the upstream saw path %q", c.target, g[0])
				}
			}
		}
		if injected != c.inject {
			t.Errorf("%s: injected=%v (want %v); upstream saw %q, sandbox got status %d", c.target, injected, c.inject, got, res.status)
		}
		if where := leaks(res, nil, egressSecret); where != "" {
			t.Errorf("%s: the secret reached the sandbox: %s", c.target, where)
		}
	}
}

// TestAdversarialBridgeEncodedEcho: a connector's upstream echoes the
// credential compressed (the client asked for compression, or not) and in
// a trailer; nothing of it reaches the sandbox through the bridge.
func TestAdversarialBridgeEncodedEcho(t *testing.T) {
	cred := "upcred" + randHex(12)
	seen := &pathLog{}
	up := httptest.NewServer(hostileHandler(t, seen))
	defer up.Close()
	d, _ := secretDaemon(t, []map[string]string{{"name": "up", "url": up.URL, "secret": "upstream"}})
	ctx := context.Background()
	if _, err := d.client.SetSecret(ctx, "upstream", []byte(cred)); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, agentbox.SandboxSpec{})
	for _, ce := range []string{"", "gzip", "deflate", "br", "zstd", "gzip,br", "x-unknown"} {
		for _, ae := range []string{"", "Accept-Encoding: gzip, deflate, br, zstd\\r\\n"} {
			cmd := `T=$` + api.RunTokenEnv + `; (printf 'GET /v1/connectors/up/echo?hint=1&ce=` + ce + ` HTTP/1.1\r\nHost: bridge\r\nConnection: close\r\nAuthorization: Bearer %s\r\n` + ae + `\r\n' "$T"; sleep 1) | timeout 10 nc 127.0.0.1 3129 | base64`
			out := run(t, sb, cmd, agentbox.WithRunToken())
			raw, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(out.Stdout)), ""))
			if err != nil {
				t.Fatalf("ce=%s: %v (%q)", ce, err, out.Stdout)
			}
			got := seen.take()
			if len(got) != 1 || got[0][1] != "Bearer "+cred {
				t.Fatalf("ce=%s: upstream saw %q; the sandbox got %.300q (exit %d, %s)", ce, got, raw, out.ExitCode, out.Stderr)
			}
			// Informational responses, then the response.
			var info []byte
			for bytes.HasPrefix(raw, []byte("HTTP/1.1 1")) {
				block, rest, _ := bytes.Cut(raw, []byte("\r\n\r\n"))
				info, raw = append(append(info, block...), '\n'), rest
			}
			head, body, _ := bytes.Cut(raw, []byte("\r\n\r\n"))
			body, trailers := dechunk(body)
			res := rawResult{text: string(info) + string(head) + "\n" + string(trailers), body: body}
			if where := leaks(res, strings.Split(ce, ","), cred); where != "" {
				t.Errorf("ce=%s %q: the credential reached the sandbox: %s", ce, ae, where)
			}
			st := status(string(raw))
			if unknown := ce == "x-unknown"; unknown != (st == "502") {
				t.Errorf("ce=%s: status %s", ce, st)
			}
		}
	}
}

// dechunk undoes chunked transfer coding, best effort: it returns the
// body and the trailer section (b and nil when b is not chunked).
func dechunk(b []byte) ([]byte, []byte) {
	var out []byte
	rest := b
	for {
		line, after, ok := bytes.Cut(rest, []byte("\r\n"))
		if !ok {
			return b, nil
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil || n < 0 {
			return b, nil
		}
		if n == 0 {
			return out, after
		}
		if int64(len(after)) < n {
			return b, nil
		}
		out = append(out, after[:n]...)
		rest = bytes.TrimPrefix(after[n:], []byte("\r\n"))
	}
}
