package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

var _ UpgradeService = (*fakeService)(nil)

func (f *fakeService) StageRunner(ctx context.Context, r io.Reader) (api.Runner, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return api.Runner{}, err
	}
	f.mu.Lock()
	f.upload = b
	f.mu.Unlock()
	return api.Runner{Hash: "0123456789abcdef", Build: "b"}, f.call("StageRunner")
}

func (f *fakeService) ListRunners(ctx context.Context) ([]api.Runner, error) {
	return nil, f.call("ListRunners")
}

func (f *fakeService) UpgradeSandbox(ctx context.Context, id string, req api.UpgradeRequest) (api.UpgradeResult, error) {
	return api.UpgradeResult{Sandbox: sandbox(id), Changed: true}, f.call("UpgradeSandbox", id, req)
}

func TestUpgradeRoutes(t *testing.T) {
	cases := []routeCase{
		{"POST", "/v1/sandboxes/sb1/upgrade", `{"runner":"/opt/agentbox"}`, nil, 200, "UpgradeSandbox", []any{"sb1", api.UpgradeRequest{Runner: "/opt/agentbox"}}},
		{"POST", "/v1/sandboxes/sb1/upgrade", ``, nil, 200, "UpgradeSandbox", []any{"sb1", api.UpgradeRequest{}}},
		{"POST", "/v1/sandboxes/sb1/upgrade", `{"runner_hash":"0123456789abcdef"}`, fmt.Errorf("rolled back: %w", errdefs.ErrFailedPrecondition), 412, "UpgradeSandbox", nil},
		{"POST", "/v1/sandboxes/sb1/upgrade", `{"runner":"/x"}`, fmt.Errorf("self-check failed: %w", errdefs.ErrInvalidArgument), 400, "UpgradeSandbox", nil},
		{"POST", "/v1/sandboxes/sb1/upgrade", `{"binary":"x"}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes/B@D/upgrade", `{}`, nil, 400, "", nil},
		{"GET", "/v1/runners", ``, nil, 200, "ListRunners", nil},
		{"POST", "/v1/runners", "\x7fELF...", nil, 201, "StageRunner", nil},
		{"POST", "/v1/runners", "#!/bin/sh", fmt.Errorf("not an ELF: %w", errdefs.ErrInvalidArgument), 400, "StageRunner", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			f, rec, called := tc.serve(t)
			if !called {
				return
			}
			switch {
			case tc.call == "StageRunner":
				if string(f.upload) != tc.body {
					t.Fatalf("service read %q, want %q", f.upload, tc.body)
				}
			case tc.call == "ListRunners":
				var rl api.RunnerList
				if err := json.Unmarshal(rec.Body.Bytes(), &rl); err != nil || rl.Runners == nil {
					t.Fatalf("body %q: %v", rec.Body, err)
				}
			}
		})
	}
}

// An uploaded runner larger than the upload limit is refused with 413.
func TestStageRunnerTooLarge(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{MaxUploadBytes: 10})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/runners", strings.NewReader(strings.Repeat("x", 100))))
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413: %s", rec.Code, rec.Body)
	}
}

func TestUpgradeRoutesOptional(t *testing.T) {
	type plain struct{ Service }
	h := New(plain{&fakeService{}}, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/sandboxes/sb1/upgrade", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", rec.Code)
	}
}

func TestOpenAPIUpgradeSchemas(t *testing.T) {
	doc := loadSpec(t)
	for _, v := range []any{api.UpgradeRequest{}, api.UpgradeResult{}, api.Runner{}, api.RunnerList{}} {
		rt := reflect.TypeOf(v)
		s, ok := doc.Components.Schemas[rt.Name()]
		if !ok {
			t.Errorf("schema %s missing", rt.Name())
			continue
		}
		for i := 0; i < rt.NumField(); i++ {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if _, ok := s.Properties[name]; !ok {
				t.Errorf("%s: field %q not in schema", rt.Name(), name)
			}
		}
		if len(s.Properties) != rt.NumField() {
			t.Errorf("%s: schema has %d properties, type %d fields", rt.Name(), len(s.Properties), rt.NumField())
		}
	}
}

// On an API-key listener a runner may only be named by the hash of an
// uploaded binary: a host path is refused before the service is called.
func TestUpgradeByHostPathOnlyOnUnixSocket(t *testing.T) {
	const key = "upgrade-test-key-0123456789"
	f := &fakeService{}
	h := New(f, Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{"example.com"}})
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"runner":"/usr/bin/anything"}`, http.StatusForbidden},
		{`{"runner_hash":"0123456789abcdef"}`, http.StatusOK},
	} {
		req := httptest.NewRequest("POST", "/v1/sandboxes/sb1/upgrade", strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Fatalf("%s over TCP: status %d, want %d: %s", tc.body, rec.Code, tc.status, rec.Body)
		}
	}
	if len(f.calls) != 1 {
		t.Fatalf("service calls %v, want only the runner_hash upgrade", f.calls)
	}
}
