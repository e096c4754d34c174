package test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/redact"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// httpsget is a static client uploaded into sandboxes: it follows the
// proxy environment and SSL_CERT_FILE like most programs do.
const httpsgetSrc = `package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
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
		if k == "SNI" {
			http.DefaultTransport.(*http.Transport).TLSClientConfig = &tls.Config{ServerName: v}
			continue
		}
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if os.Getenv("NOFOLLOW") != "" {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("STATUS %d\n%s\nHDR %s\n", resp.StatusCode, b, resp.Header.Get("X-Echo-Auth"))
	if resp.StatusCode >= 400 {
		os.Exit(1)
	}
}
`

const egressSecret = "ghp_REALsecretVALUE_9f8e7d"

type upstream struct {
	tlsPort, httpPort int
	mu                sync.Mutex
	auth              []string
}

// startUpstreams runs an HTTPS server (certificate from a test CA) and a
// plain HTTP server on 127.0.0.2 and writes the daemon's egress files.
func startUpstreams(t *testing.T, dir string) *upstream {
	t.Helper()
	ca, err := egress.LoadOrCreateCA(dir, "integration upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auth = append(u.auth, r.Header.Get("Authorization"))
		u.mu.Unlock()
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "hello from %s auth=%s", r.Host, r.Header.Get("Authorization"))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://denied.test:"+strconv.Itoa(u.tlsPort)+"/", http.StatusFound)
	})
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	s := httptest.NewUnstartedServer(mux)
	s.Listener.Close()
	s.Listener = listen()
	s.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }}
	s.StartTLS()
	t.Cleanup(s.Close)
	u.tlsPort = s.Listener.Addr().(*net.TCPAddr).Port
	p := httptest.NewUnstartedServer(mux)
	p.Listener.Close()
	p.Listener = listen()
	p.Start()
	t.Cleanup(p.Close)
	u.httpPort = p.Listener.Addr().(*net.TCPAddr).Port

	hosts := "127.0.0.2 good.test api.good.test denied.test\n127.0.0.1 loop.good.test\n169.254.169.254 meta.good.test\n"
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "upstream-ca.pem"), ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTBOX_EGRESS_HOSTS_FILE", filepath.Join(dir, "hosts"))
	t.Setenv("AGENTBOX_EGRESS_CA_FILE", filepath.Join(dir, "upstream-ca.pem"))
	t.Setenv("AGENTBOX_EGRESS_PERMIT", "127.0.0.2/32")
	return u
}

func TestEgressFromInsideSandbox(t *testing.T) { egressFromInside(t, "native") }

// TestEgressFromInsideSandboxGvisor: the same from a gvisor sandbox, whose
// loopback is the sentry's network stack and whose only way out is the
// guest's tunnel, as under native.
func TestEgressFromInsideSandboxGvisor(t *testing.T) {
	requiresRunsc(t)
	egressFromInside(t, "gvisor")
}

// egressFromInside checks the egress path and its policy from inside a
// sandbox on backend rt.
func egressFromInside(t *testing.T, rt string) {
	dir := t.TempDir()
	up := startUpstreams(t, dir)
	bin := buildStatic(t, dir, "httpsget", httpsgetSrc)
	d := newDaemon(t)
	if code, body := d.rawRequest(t, "PUT", "/v1/secrets/gh", []byte(egressSecret)); code != 200 {
		t.Fatalf("storing secret: %d %s", code, body)
	}
	hp, tp := strconv.Itoa(up.httpPort), strconv.Itoa(up.tlsPort)
	sb := d.create(t, agentbox.SandboxSpec{Runtime: rt, Network: &api.NetworkSpec{
		Mode:        api.NetworkEgress,
		Allow:       []string{"good.test:" + hp, "good.test:" + tp, "loop.good.test:*", "meta.good.test:*", "denied.test:*"},
		Deny:        []string{"denied.test"},
		Credentials: []api.CredentialRule{{Secret: "gh", Host: "api.good.test", Port: up.tlsPort}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sb.WriteFile(ctx, "/usr/local/bin/httpsget", bin, 0o755); err != nil {
		t.Fatal(err)
	}

	// The upstream's test CA stands in for a public root in the image's
	// trust store (tunnelled destinations present their own certificate).
	upCA, err := os.ReadFile(filepath.Join(dir, "upstream-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/tmp/upstream-ca.pem", upCA, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "cat /tmp/upstream-ca.pem >> /etc/ssl/agentbox-bundle.pem")

	// Allowed destinations work through the proxy.
	if out := mustRun(t, sb, "wget -q -O - http://good.test:"+hp+"/plain"); !strings.Contains(out, "hello from good.test") {
		t.Fatalf("allowed plain http: %q", out)
	}
	if out := mustRun(t, sb, "httpsget https://good.test:"+tp+"/tunnel"); !strings.Contains(out, "STATUS 200") {
		t.Fatalf("allowed https tunnel: %q", out)
	}

	// Each of these fails.
	for _, cmd := range []string{
		"wget -Y off -q -O - http://good.test:" + hp + "/",             // ignoring the proxy: no DNS
		"wget -Y off -q -O - http://127.0.0.2:" + hp + "/",             // raw IP, ignoring the proxy: no route
		"wget -Y off -q -O - http://127.0.0.1:" + hp + "/",             // host loopback is not the sandbox's
		"wget -q -O - http://127.0.0.2:" + hp + "/",                    // raw IP through the proxy
		"wget -q -O - http://2130706433:" + hp + "/",                   // decimal IP form
		"wget -q -O - http://0x7f000002:" + hp + "/",                   // hex IP form
		"wget -q -O - http://loop.good.test:" + hp + "/",               // allowed name resolving to loopback
		"wget -q -O - http://meta.good.test/latest/meta-data/",         // allowed name resolving to metadata
		"wget -q -O - http://good.test.evil.test:" + hp + "/",          // suffix trick
		"wget -q -O - http://evilgood.test:" + hp + "/",                // suffix trick
		"wget -q -O - http://good.test:1/",                             // allowed host, other port
		"httpsget https://good.test:1/",                                // CONNECT to a port not allowed
		"httpsget https://denied.test:" + tp + "/",                     // deny wins
		"httpsget https://api.good.test:" + tp + "/ SNI:good.test",     // SNI differs from CONNECT
		"httpsget https://api.good.test:" + tp + "/ Host:good.test",    // Host differs from CONNECT
		"httpsget https://api.good.test:" + tp + "/redirect",           // redirect to a denied origin
		"echo x | nc -u -w 1 8.8.8.8 53 || exit 1; nslookup good.test", // UDP/DNS
	} {
		// (139 would be a crash of the client, not a refusal.)
		if res := run(t, sb, cmd); res.ExitCode == 0 || res.ExitCode == 139 {
			t.Errorf("%q from inside: exit %d: %s %s", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
	}

	// Credential injection: the client's own Authorization is replaced, the
	// upstream gets the real value, and its echo is scrubbed.
	up.mu.Lock()
	up.auth = nil
	up.mu.Unlock()
	out := mustRun(t, sb, "httpsget https://api.good.test:"+tp+"/repos Authorization:Bearer-from-inside")
	up.mu.Lock()
	got := append([]string(nil), up.auth...)
	up.mu.Unlock()
	if len(got) != 1 || got[0] != "Bearer "+egressSecret {
		t.Fatalf("upstream saw Authorization %q", got)
	}
	if strings.Contains(out, egressSecret) || strings.Contains(out, "from-inside") || !strings.Contains(out, redact.Replacement("gh")) {
		t.Fatalf("response inside: %q", out)
	}
	if out := run(t, sb, "NOFOLLOW=1 httpsget https://api.good.test:"+tp+"/redirect"); !strings.Contains(string(out.Stdout), "STATUS 302") {
		t.Fatalf("redirect not passed through: %q", out.Stdout)
	}

	// The secret is nowhere inside: no environment, no file.
	scan := "cat /proc/[0-9]*/environ 2>/dev/null | grep -c " + egressSecret + "; grep -rl " + egressSecret + " /etc /root /tmp /home /usr /bin /var /.agentbox 2>/dev/null; true"
	if res := mustRun(t, sb, scan); strings.TrimSpace(res) != "0" {
		t.Fatalf("secret found inside: %q", res)
	}
	if env := mustRun(t, sb, "env"); !strings.Contains(env, "HTTPS_PROXY=http://127.0.0.1:3128") || !strings.Contains(env, "SSL_CERT_FILE=") {
		t.Fatalf("proxy env missing: %s", env)
	}

	// Records: queryable, naming the credential but never its value.
	recs, err := sb.EgressLog(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(recs)
	if strings.Contains(string(raw), egressSecret) {
		t.Fatal("egress records hold the secret")
	}
	var injected, denied bool
	for _, r := range recs {
		if r.Kind == "request" && len(r.Credentials) == 1 && r.Credentials[0] == "gh" && r.Path == "/repos" {
			injected = true
		}
		if r.Decision == api.EgressDenied && r.SandboxID == sb.ID() {
			denied = true
		}
	}
	if !injected || !denied {
		t.Fatalf("records lack the injected request or denials: %s", raw)
	}

	// Policy changes at runtime: mode none closes the proxy.
	if err := sb.SetNetwork(ctx, api.NetworkSpec{Mode: api.NetworkNone}); err != nil {
		t.Fatal(err)
	}
	if res := run(t, sb, "wget -q -O - http://good.test:"+hp+"/plain"); res.ExitCode == 0 {
		t.Fatalf("mode none still reaches out: %s", res.Stdout)
	}
	if err := sb.SetNetwork(ctx, api.NetworkSpec{Mode: api.NetworkEgress, Allow: []string{"good.test:" + hp}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, func() bool { return run(t, sb, "wget -q -O - http://good.test:"+hp+"/plain").ExitCode == 0 })

	// A restarted daemon re-opens the tunnel and re-applies the policy.
	d.restart(syscall.SIGKILL)
	sb2, err := d.client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, d, func() bool { return run(t, sb2, "wget -q -O - http://good.test:"+hp+"/plain").ExitCode == 0 })
}

func waitFor(t *testing.T, d *daemon, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(d.logPath)
			var lines []string
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "tunnel") || strings.Contains(l, "egress") || strings.Contains(l, "network") {
					lines = append(lines, l)
				}
			}
			t.Fatalf("condition not met in 20s; tunnel and egress log:\n%s", tail(strings.Join(lines, "\n"), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
