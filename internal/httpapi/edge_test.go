package httpapi

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Without a key, GET /v1/health is all TCP answers, with {"status":"ok"}
// and no version; a wrong key, another route or another method still gets
// 401, also without a version.
func TestAnonymousHealthRevealsNothing(t *testing.T) {
	const key = "k-0123456789abcdef"
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}})
	rec := do(h, "GET", "/v1/health", "")
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"status":"ok"}` || rec.Header().Get(api.VersionHeader) != "" {
		t.Fatalf("anonymous health: %d %q version %q", rec.Code, rec.Body, rec.Header().Get(api.VersionHeader))
	}
	for _, tc := range []struct {
		method, path string
		hdr          []string
	}{
		{"GET", "/v1/info", nil},
		{"POST", "/v1/health", nil},
		{"GET", "/v1/health", []string{"Authorization", "Bearer wrong-key-0123456789"}},
		{"GET", "/v1/health", []string{"Authorization", "Basic eDp5"}},
	} {
		rec := do(h, tc.method, tc.path, "", tc.hdr...)
		if rec.Code != http.StatusUnauthorized || rec.Header().Get(api.VersionHeader) != "" {
			t.Errorf("%s %s %v: %d version %q, want 401 without a version", tc.method, tc.path, tc.hdr, rec.Code, rec.Header().Get(api.VersionHeader))
		}
	}
	// Authenticated callers learn the version; the unix socket always.
	if rec := do(h, "GET", "/v1/health", "", "Authorization", "Bearer "+key); rec.Code != 200 || rec.Header().Get(api.VersionHeader) != "1.2.3" {
		t.Errorf("health with a key: %d version %q", rec.Code, rec.Header().Get(api.VersionHeader))
	}
	hu, _ := newTestHandler(t, &fakeService{}, Options{})
	if rec := do(hu, "GET", "/v1/health", ""); rec.Code != 200 || rec.Header().Get(api.VersionHeader) != "1.2.3" {
		t.Errorf("unix health: %d version %q", rec.Code, rec.Header().Get(api.VersionHeader))
	}
}

// fixedLimiter refuses every key in deny.
type fixedLimiter map[string]time.Duration

func (f fixedLimiter) Allow(key string) (time.Duration, bool) {
	d, deny := f[key]
	return d, !deny
}

func TestRateLimitedPrincipalGets429(t *testing.T) {
	reg, full, _ := newRegistry(t)
	const adminKey = "k-0123456789abcdef"
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{adminKey}, Tenants: reg, RateLimit: fixedLimiter{"t1": 1500 * time.Millisecond}})
	rec := do(h, "GET", "/v1/sandboxes", "", "Authorization", "Bearer "+full.Key)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" {
		t.Fatalf("limited tenant: %d Retry-After %q, want 429 and 2", rec.Code, rec.Header().Get("Retry-After"))
	}
	if e := decodeError(t, rec); e.Code != "resource_exhausted" {
		t.Fatalf("limited tenant: code %q", e.Code)
	}
	if rec := do(h, "GET", "/v1/sandboxes", "", "Authorization", "Bearer "+adminKey); rec.Code != 200 {
		t.Fatalf("another principal: %d", rec.Code)
	}
	// Unauthenticated requests never reach the limiter (nor learn of it).
	if rec := do(h, "GET", "/v1/sandboxes", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", rec.Code)
	}
}
