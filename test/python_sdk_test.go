package test

import (
	"context"
	"crypto/tls"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestPythonSDK runs the Python SDK's unittest suite (sdk/python/tests)
// against a private daemon, on the python3 on PATH with no third-party
// package: CI runs it in the integration step. The daemon listens on
// loopback TCP; the suite gets a full key of one tenant (AGENTBOX_HOST,
// AGENTBOX_API_KEY, as a user sets them), a key of a tenant whose quota
// allows one sandbox (for a 429 with Retry-After), a revoked key (for a
// 401), the daemon's unix socket (the admin's transport), an https address
// of the daemon with the CA that verifies it (a TLS-terminating proxy in
// front of it) and the agentbox binary (staged as a guest runner).
func TestPythonSDK(t *testing.T) {
	python := testutil.RequiresBinary(t, "python3")
	d, base := tenancyDaemon(t)
	ctx := context.Background()

	_, key := tenantClient(t, d, base, "py-main", api.Quotas{}, api.ScopeFull)
	_, quotaKey := tenantClient(t, d, base, "py-quota", api.Quotas{MaxSandboxes: 1}, api.ScopeFull)
	_, revoked := tenantClient(t, d, base, "py-revoked", api.Quotas{}, api.ScopeFull)
	if err := d.client.RevokeAPIKey(ctx, revoked.ID); err != nil {
		t.Fatalf("revoking a key: %v", err)
	}

	tlsHost, caPath := tlsFront(t, base)

	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, python, "-m", "unittest", "discover", "-v", "sdk/python/tests")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"AGENTBOX_HOST="+base,
		"AGENTBOX_API_KEY="+key.Key,
		"AGENTBOX_CA_CERT=",
		"AGENTBOX_TEST_QUOTA_KEY="+quotaKey.Key,
		"AGENTBOX_TEST_REVOKED_KEY="+revoked.Key,
		"AGENTBOX_TEST_UNIX_HOST=unix://"+d.socket,
		"AGENTBOX_TEST_TLS_HOST="+tlsHost,
		"AGENTBOX_TEST_TLS_CA="+caPath,
		"AGENTBOX_TEST_BIN="+agentboxBin(t),
		"PYTHONPATH="+filepath.Join(root, "sdk", "python"),
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONUNBUFFERED=1",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest discover -v sdk/python/tests: %v\n%s", err, out)
	}
	t.Logf("python3 -m unittest discover -v sdk/python/tests:\n%s", out)
}

// tlsFront serves the daemon at base over https, through a streaming
// reverse proxy with a certificate of a test CA; it returns the https
// address and the CA's PEM file.
func tlsFront(t *testing.T, base string) (host, caPath string) {
	t.Helper()
	caPath, certPath, keyPath := writeTestCert(t, t.TempDir())
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // exec and build streams pass through as they come
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(proxy)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, caPath
}
