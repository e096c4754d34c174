package httpapi

import (
	"io"
	"net/http"
	"testing"
)

// POST /mcp reaches Options.MCP only authenticated, with the caller in
// the request's context; without an MCP handler it is 404, and other
// methods are 405.
func TestMCPRoute(t *testing.T) {
	const key = "k-0123456789abcdef"
	reached := 0
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		_, _ = io.WriteString(w, CallerFrom(r.Context()))
	})
	h, _ := newTestHandler(t, &fakeService{}, Options{RequireAuth: true, APIKeys: []string{key}, MCP: mcp})
	if rec := do(h, "POST", "/mcp", "{}"); rec.Code != http.StatusUnauthorized || reached != 0 {
		t.Errorf("POST /mcp without a key: %d (handler reached %d times), want 401", rec.Code, reached)
	}
	rec := do(h, "POST", "/mcp", "{}", "Authorization", "Bearer "+key)
	if rec.Code != http.StatusOK || reached != 1 || rec.Body.String() == "" {
		t.Errorf("POST /mcp with a key: %d %q (handler reached %d times), want the caller", rec.Code, rec.Body, reached)
	}
	if rec := do(h, "GET", "/mcp", "", "Authorization", "Bearer "+key); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /mcp: %d, want 405", rec.Code)
	}
	hn, _ := newTestHandler(t, &fakeService{}, Options{})
	if rec := do(hn, "POST", "/mcp", "{}"); rec.Code != http.StatusNotFound {
		t.Errorf("POST /mcp without an MCP handler: %d, want 404", rec.Code)
	}
}
