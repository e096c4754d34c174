package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional checkpoint interface, so its
// routes are registered (and checked against the spec) in every test.
var _ CheckpointService = (*fakeService)(nil)

func (f *fakeService) CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (api.Checkpoint, error) {
	if err := f.call("CreateCheckpoint", id, req); err != nil {
		return api.Checkpoint{}, err
	}
	return api.Checkpoint{ID: "ck1", Name: req.Name, SandboxID: id, CreatedAt: time.Unix(0, 0).UTC()}, nil
}

func (f *fakeService) ListCheckpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	if err := f.call("ListCheckpoints", id); err != nil {
		return nil, err
	}
	return nil, nil
}

func (f *fakeService) GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error) {
	if err := f.call("GetCheckpoint", cid); err != nil {
		return api.Checkpoint{}, err
	}
	return api.Checkpoint{ID: cid}, nil
}

func (f *fakeService) DeleteCheckpoint(ctx context.Context, cid string) error {
	return f.call("DeleteCheckpoint", cid)
}

func (f *fakeService) Restore(ctx context.Context, id, checkpoint string) (api.RestoreResult, error) {
	if err := f.call("Restore", id, checkpoint); err != nil {
		return api.RestoreResult{}, err
	}
	return api.RestoreResult{Sandbox: api.Sandbox{ID: id}, Checkpoint: checkpoint, DurationMS: 7}, nil
}

func (f *fakeService) ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error) {
	if err := f.call("ForkCheckpoint", cid, req); err != nil {
		return api.ForkResult{}, err
	}
	return api.ForkResult{Checkpoint: cid, Sandboxes: make([]api.Sandbox, req.Count)}, nil
}

func (f *fakeService) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error) {
	if err := f.call("ForkSandbox", id, req); err != nil {
		return api.ForkResult{}, err
	}
	return api.ForkResult{Checkpoint: "implicit"}, nil
}

func TestCheckpointRoutes(t *testing.T) {
	cases := []routeCase{
		{"POST", "/v1/sandboxes/sb1/checkpoints", `{"name":"before","labels":{"k":"v"}}`, nil, 201, "CreateCheckpoint", []any{"sb1", api.CreateCheckpointRequest{Name: "before", Labels: map[string]string{"k": "v"}}}},
		{"POST", "/v1/sandboxes/sb1/checkpoints", ``, nil, 201, "CreateCheckpoint", []any{"sb1", api.CreateCheckpointRequest{}}},
		{"POST", "/v1/sandboxes/sb1/checkpoints", `{"nme":"x"}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes/sb1/checkpoints", `{}`, fmt.Errorf("busy: %w", errdefs.ErrConflict), 409, "CreateCheckpoint", nil},
		{"GET", "/v1/sandboxes/sb1/checkpoints", ``, nil, 200, "ListCheckpoints", []any{"sb1"}},
		{"GET", "/v1/checkpoints", ``, nil, 200, "ListCheckpoints", []any{""}},
		{"GET", "/v1/checkpoints/ck1", ``, nil, 200, "GetCheckpoint", []any{"ck1"}},
		{"GET", "/v1/checkpoints/CK!", ``, nil, 400, "", nil},
		{"DELETE", "/v1/checkpoints/ck1", ``, nil, 204, "DeleteCheckpoint", []any{"ck1"}},
		{"DELETE", "/v1/checkpoints/ck1", ``, fmt.Errorf("in use: %w", errdefs.ErrConflict), 409, "DeleteCheckpoint", nil},
		{"POST", "/v1/sandboxes/sb1/restore", `{"checkpoint":"ck1"}`, nil, 200, "Restore", []any{"sb1", "ck1"}},
		{"POST", "/v1/sandboxes/sb1/restore", `{}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes/sb1/restore", ``, nil, 400, "", nil},
		{"POST", "/v1/checkpoints/ck1/fork", `{"count":3,"env":{"A":"b"}}`, nil, 201, "ForkCheckpoint", []any{"ck1", api.ForkRequest{Count: 3, Env: map[string]string{"A": "b"}}}},
		{"POST", "/v1/checkpoints/ck1/fork", `{"count":"3"}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes/sb1/fork", ``, nil, 201, "ForkSandbox", []any{"sb1", api.ForkRequest{}}},
		{"POST", "/v1/sandboxes/sb1/fork", `{}`, fmt.Errorf("gone: %w", errdefs.ErrNotFound), 404, "ForkSandbox", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			_, rec, called := tc.serve(t)
			if !called {
				return
			}
			if tc.status >= 400 {
				var e api.Error
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
					t.Fatalf("error body %q: %v", rec.Body, err)
				}
			}
		})
	}
}

// A Service without the checkpoint interface has no checkpoint routes.
func TestCheckpointRoutesOptional(t *testing.T) {
	type plain struct{ Service }
	h := New(plain{&fakeService{}}, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/checkpoints", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", rec.Code)
	}
}

func TestOpenAPICheckpointSchemas(t *testing.T) {
	doc := loadSpec(t)
	for _, v := range []any{api.Checkpoint{}, api.CheckpointList{}, api.CreateCheckpointRequest{}, api.RestoreRequest{}, api.RestoreResult{}, api.ForkRequest{}, api.ForkResult{}} {
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
