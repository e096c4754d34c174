package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// The attacks of this file come from where a network attacker stands: any
// host that reaches the daemon's TCP port, with no key (or with one
// tenant's key), on loopback only.

// floodConn is one attacking connection: it sent GET /v1/health and idles.
type floodConn struct {
	net.Conn
	src string
}

// openFlood opens up to n loopback connections to addr from sources
// distinct source addresses (127.0.1.2, 127.0.1.3, ...; at most 250), each sending one
// GET /v1/health without a key and then idling. It is bounded in count (n)
// and time (within): dials still pending at the end are abandoned. The
// connections are closed when t ends.
func openFlood(t *testing.T, addr string, n, sources int, within time.Duration) []*floodConn {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []*floodConn
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req := "GET /v1/health HTTP/1.1\r\nHost: " + addr + "\r\n\r\n"
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				src := fmt.Sprintf("127.0.1.%d", 2+i%int64(sources))
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					continue
				}
				_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.WriteString(c, req); err != nil {
					c.Close()
					continue
				}
				mu.Lock()
				conns = append(conns, &floodConn{Conn: c, src: src})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return append([]*floodConn(nil), conns...)
}

// stillOpen waits until within has passed or every connection is closed by
// the daemon (EOF or reset after reading what it sent), and returns the
// number still open.
func stillOpen(conns []*floodConn, within time.Duration) int {
	deadline := time.Now().Add(within)
	var open atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_ = c.SetReadDeadline(deadline)
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(open.Load())
}

// TestAdversarialTCPConnectionFlood: thousands of idle keyless connections
// from many loopback addresses to a daemon whose open-file limit is 1024
// must not take the admin unix socket down (create and exec keep working),
// must not lock out a client with a key, and are closed by the daemon once
// idle.
func TestAdversarialTCPConnectionFlood(t *testing.T) {
	addr := loopbackAddr(t)
	keyFile := filepath.Join(t.TempDir(), "keys")
	key := "flood-key-" + randHex(16)
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemonWrapped(t, []string{"prlimit", "--nofile=1024:1024"}, "--tcp", addr, "--api-keys-file", keyFile)

	start := time.Now()
	conns := openFlood(t, addr, 3000, 30, 20*time.Second)
	t.Logf("flood: %d of 3000 connections from 30 addresses opened in %v", len(conns), time.Since(start).Round(time.Millisecond))

	// The admin unix socket keeps serving create and exec.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Errorf("create over the unix socket during the flood: %v", err)
	} else {
		defer sb.Delete(context.WithoutCancel(ctx))
		res, err := sb.Run(ctx, "echo $((6*7))")
		if err != nil || string(res.Stdout) != "42\n" {
			t.Errorf("exec over the unix socket during the flood: %v %+v", err, res)
		}
	}

	// Another client, with a key, is still served over TCP.
	c, err := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer lcancel()
	if _, err := c.List(lctx, nil); err != nil {
		t.Errorf("list over TCP with a key during the flood: %v", err)
	}

	// The idle, unauthenticated connections are closed by the daemon.
	if open := stillOpen(conns, 40*time.Second); open > 0 {
		t.Errorf("%d of %d idle unauthenticated connections still open %v after the flood", open, len(conns), time.Since(start).Round(time.Second))
	}
}

// TestAdversarialTCPAnonymousHealth: GET /v1/health without a key answers
// {"status":"ok"} and nothing else (no version, no other header naming
// the build); every other route still needs a key.
func TestAdversarialTCPAnonymousHealth(t *testing.T) {
	_, addr, key := tcpDaemon(t)
	resp, err := http.Get("http://" + addr + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Errorf("anonymous health: %d %q, want 200 {\"status\":\"ok\"}", resp.StatusCode, body)
	}
	for k := range resp.Header {
		switch k {
		case "Content-Type", "Content-Length", "Date", "Cache-Control", "X-Content-Type-Options", api.RequestIDHeader:
		default:
			t.Errorf("anonymous health reveals header %s: %q", k, resp.Header.Get(k))
		}
	}
	// Without a key nothing else answers, not even with the version.
	resp, err = http.Get("http://" + addr + "/v1/info")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get(api.VersionHeader) != "" {
		t.Errorf("anonymous info: %d version %q, want 401 without a version", resp.StatusCode, resp.Header.Get(api.VersionHeader))
	}
	// With a key the SDK's health check works as before.
	c, _ := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key))
	if err := c.Health(context.Background()); err != nil {
		t.Errorf("health with a key: %v", err)
	}
}

// TestAdversarialTCPForeignHost: a request through a DNS-rebound name (a
// Host header the daemon does not answer to) is refused on TCP without any
// --allowed-host configured, even with a valid key; IP literals and
// localhost are served.
func TestAdversarialTCPForeignHost(t *testing.T) {
	_, addr, key := tcpDaemon(t)
	_, port, _ := net.SplitHostPort(addr)
	for host, want := range map[string]int{
		"rebind.evil.example:" + port: http.StatusForbidden,
		"evil.example":                http.StatusForbidden,
		addr:                          http.StatusOK,
		"localhost:" + port:           http.StatusOK,
	} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/sandboxes", nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestAdversarialTCPTenantRequestRate: a tenant hammering the API is
// answered 429 with a Retry-After once over its request rate, the SDK
// exposes the hint, and another tenant and the admin socket are unaffected.
func TestAdversarialTCPTenantRequestRate(t *testing.T) {
	d, base := tenancyDaemon(t)
	noisy, _ := tenantClient(t, d, base, "noisy", api.Quotas{}, "")
	quiet, _ := tenantClient(t, d, base, "quiet", api.Quotas{}, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		limited atomic.Pointer[agentbox.APIError]
		sent    atomic.Int64
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sent.Add(1) <= 3000 && limited.Load() == nil && ctx.Err() == nil {
				_, err := noisy.List(ctx, nil)
				var ae *agentbox.APIError
				if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
					limited.Store(ae)
				} else if err != nil {
					t.Errorf("list: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	ae := limited.Load()
	if ae == nil {
		t.Fatalf("no 429 after %d requests of one tenant", min(sent.Load()-1, 3000))
	}
	if ae.RetryAfter() < time.Second || ae.Code != agentbox.CodeResourceExhausted {
		t.Errorf("429: code %q retry after %v, want resource_exhausted and >= 1s", ae.Code, ae.RetryAfter())
	}
	if _, err := quiet.List(ctx, nil); err != nil {
		t.Errorf("another tenant while the first is limited: %v", err)
	}
	if _, err := d.client.List(ctx, nil); err != nil {
		t.Errorf("admin socket while a tenant is limited: %v", err)
	}
	time.Sleep(ae.RetryAfter())
	if _, err := noisy.List(ctx, nil); err != nil {
		t.Errorf("the limited tenant after Retry-After: %v", err)
	}
}

// writeTestCert writes a self-signed CA and a server certificate for
// 127.0.0.1 and localhost signed by it into dir; it returns the paths of
// the CA, the certificate and the key.
func writeTestCert(t *testing.T, dir string) (caPath, certPath, keyPath string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentbox test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "agentbox"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	caPath, certPath, keyPath = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for p, b := range map[string][]byte{
		caPath:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPath: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		keyPath:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caPath, certPath, keyPath
}

// TestAdversarialTCPTLS: with --tls-cert/--tls-key the TCP listener speaks
// only TLS; the SDK and the CLI reach it verifying the certificate against
// a CA given to them, and refuse it without that CA.
func TestAdversarialTCPTLS(t *testing.T) {
	dir := t.TempDir()
	caPath, certPath, keyPath := writeTestCert(t, dir)
	addr := loopbackAddr(t)
	keyFile := filepath.Join(dir, "keys")
	key := "tls-key-" + randHex(16)
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := newDaemonWith(t, "--tcp", addr, "--api-keys-file", keyFile, "--tls-cert", certPath, "--tls-key", keyPath)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})

	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentbox.New(agentbox.WithHost("https://"+addr), agentbox.WithAPIKey(key), agentbox.WithCACert(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, sb.ID())
	if err != nil {
		t.Fatalf("get over TLS with the CA: %v", err)
	}
	if res, err := got.Run(ctx, "echo tls"); err != nil || string(res.Stdout) != "tls\n" {
		t.Errorf("exec over TLS: %v %+v", err, res)
	}
	// Without the CA the certificate is refused.
	untrusted, _ := agentbox.New(agentbox.WithHost("https://"+addr), agentbox.WithAPIKey(key))
	if _, err := untrusted.List(ctx, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("list over TLS without the CA: %v, want a certificate error", err)
	}
	// Plain HTTP is not served on the TLS port.
	if resp, err := http.Get("http://" + addr + "/v1/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP on the TLS listener: %d", resp.StatusCode)
		}
	}
	// A raw TLS client without the CA fails the handshake.
	if conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "127.0.0.1"}); err == nil {
		conn.Close()
		t.Errorf("TLS handshake verified without the CA")
	}
	// The CLI verifies against AGENTBOX_CA_CERT.
	cmd := exec.Command(agentboxBin(t), "--host", "https://"+addr, "ls")
	cmd.Env = append(os.Environ(), agentbox.EnvAPIKey+"="+key, agentbox.EnvCACert+"="+caPath)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), sb.ID()) {
		t.Errorf("agentbox ls over TLS with %s: %v\n%s", agentbox.EnvCACert, err, out)
	}
	cmd = exec.Command(agentboxBin(t), "--host", "https://"+addr, "ls")
	cmd.Env = append(os.Environ(), agentbox.EnvAPIKey+"="+key)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("agentbox ls over TLS without the CA succeeded:\n%s", out)
	}
}

// slowReader yields its data one piece every interval.
type slowReader struct {
	pieces   []string
	interval time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	if len(s.pieces) == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.interval)
	n := copy(p, s.pieces[0])
	s.pieces = s.pieces[1:]
	return n, nil
}

// TestAdversarialTCPTimeoutsSpareStreams: the timeouts that cut idle and
// slow unauthenticated clients never cut an authenticated stream: an exec
// whose output comes after longer than the unauthenticated idle time, an
// upload trickling in over as long, and a signed webhook delivery (no key:
// the signature authenticates it) waiting for a run as long, all complete
// over TCP.
func TestAdversarialTCPTimeoutsSpareStreams(t *testing.T) {
	d, addr, key := tcpDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	c, _ := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tsb, err := c.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	res, err := tsb.Run(ctx, "sleep 13; echo done")
	if err != nil || string(res.Stdout) != "done\n" {
		t.Errorf("exec of 13 s over TCP: %v %+v", err, res)
	}
	body := &slowReader{pieces: []string{"a", "b", "c", "d", "e", "f", "g"}, interval: 2 * time.Second}
	if err := tsb.WriteFileFrom(ctx, "/tmp/slow", body, 0o644); err != nil {
		t.Errorf("upload over 14 s over TCP: %v", err)
	} else if got := mustRun(t, sb, "cat /tmp/slow"); got != "abcdefg" {
		t.Errorf("uploaded %q", got)
	}
	hk, err := d.client.CreateHook(ctx, agentbox.RunAction{Template: "busybox", Command: "sleep 13; echo hooked"})
	if err != nil {
		t.Fatal(err)
	}
	anon, _ := agentbox.New(agentbox.WithHost("http://" + addr))
	if run, err := anon.DeliverHook(ctx, hk.ID, hk.Secret, []byte("{}"), true); err != nil || string(run.Output) != "hooked\n" {
		t.Errorf("signed delivery over TCP waiting 13 s for its run: %v %q", err, run.Output)
	}
}
