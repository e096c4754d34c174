package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional secret and event interfaces, so
// their routes are registered (and checked against the spec) in every test.
var (
	_ SecretService = (*fakeService)(nil)
	_ EventService  = (*fakeService)(nil)
)

func (f *fakeService) PutSecret(ctx context.Context, name string, value []byte) (api.SecretInfo, error) {
	if err := f.call("PutSecret", name, string(value)); err != nil {
		return api.SecretInfo{}, err
	}
	return api.SecretInfo{Name: name, CreatedAt: t0, UpdatedAt: t0}, nil
}

func (f *fakeService) ListSecrets(ctx context.Context) ([]api.SecretInfo, error) {
	if err := f.call("ListSecrets"); err != nil {
		return nil, err
	}
	return []api.SecretInfo{{Name: "a", CreatedAt: t0, UpdatedAt: t0}}, nil
}

func (f *fakeService) DeleteSecret(ctx context.Context, name string) error {
	return f.call("DeleteSecret", name)
}

func (f *fakeService) SandboxEvents(ctx context.Context, id string) ([]api.SandboxEvent, error) {
	if err := f.call("SandboxEvents", id); err != nil {
		return nil, err
	}
	return []api.SandboxEvent{{Time: t0, SandboxID: id, RunID: "r", Type: "log", Message: "hi"}}, nil
}

func TestSecretRoutes(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{})
	do := func(method, path, ctype, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	// Raw body.
	w := do("PUT", "/v1/secrets/github", "application/octet-stream", "s3cr3t")
	if w.Code != 200 {
		t.Fatalf("raw put: %d %s", w.Code, w.Body)
	}
	if _, args := f.lastCall(); args[0] != "github" || args[1] != "s3cr3t" {
		t.Fatalf("raw put args %v", args)
	}
	if strings.Contains(w.Body.String(), "s3cr3t") {
		t.Fatalf("value echoed: %s", w.Body)
	}
	// JSON body.
	if w := do("PUT", "/v1/secrets/github", "application/json", `{"value":"v2"}`); w.Code != 200 {
		t.Fatalf("json put: %d %s", w.Code, w.Body)
	}
	if _, args := f.lastCall(); args[1] != "v2" {
		t.Fatalf("json put args %v", args)
	}
	for _, c := range []struct{ path, ctype, body string }{
		{"/v1/secrets/bad%20name", "", "x"},
		{"/v1/secrets/ok", "", ""},
		{"/v1/secrets/ok", "application/json", `{"value":"x","extra":1}`},
		{"/v1/secrets/ok", "application/json", `{"value":""}`},
	} {
		if w := do("PUT", c.path, c.ctype, c.body); w.Code != 400 {
			t.Errorf("put %s %q: %d, want 400", c.path, c.body, w.Code)
		}
	}
	if w := do("PUT", "/v1/secrets/big", "", strings.Repeat("x", maxSecretBody+1)); w.Code != 413 {
		t.Errorf("oversize: %d", w.Code)
	}
	w = do("GET", "/v1/secrets", "", "")
	var list api.SecretList
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || w.Code != 200 || len(list.Secrets) != 1 {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	if w := do("DELETE", "/v1/secrets/github", "", ""); w.Code != 204 {
		t.Fatalf("delete: %d", w.Code)
	}
	f.mu.Lock()
	f.err = errdefs.ErrNotFound
	f.mu.Unlock()
	if w := do("DELETE", "/v1/secrets/github", "", ""); w.Code != 404 {
		t.Fatalf("delete missing: %d", w.Code)
	}
}

func TestSandboxEventsRoute(t *testing.T) {
	h := New(&fakeService{}, Options{})
	req := httptest.NewRequest("GET", "/v1/sandboxes/sb1/events", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var list api.SandboxEventList
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || w.Code != http.StatusOK || len(list.Events) != 2 || list.Events[0].SandboxID != "sb1" {
		t.Fatalf("events: %d %s", w.Code, w.Body)
	}
	if !list.Events[0].Time.Equal(t0) || list.Events[0].Time.Location() != time.UTC {
		t.Fatalf("time %v", list.Events[0].Time)
	}
}

// The secret and event wire types match their schemas field for field.
func TestOpenAPISecretSchemas(t *testing.T) {
	checkSchemaFields(t, loadSpec(t), api.SecretInfo{}, api.SecretList{}, api.PutSecretRequest{}, api.ExecSecret{}, api.SandboxEvent{}, api.SandboxEventList{})
}
