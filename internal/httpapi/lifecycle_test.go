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

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// CreateOrGetSandbox records a CreateSandbox call (the route is the same);
// the name "existing" stands for a live sandbox of that name.
func (f *fakeService) CreateOrGetSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, bool, error) {
	sb, err := f.CreateSandbox(ctx, req)
	return sb, req.Name != "existing", err
}

func (f *fakeService) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	s := sandbox(id)
	s.State = api.StatePaused
	return s, f.call("PauseSandbox", id)
}

func (f *fakeService) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return sandbox(id), f.call("ResumeSandbox", id)
}

func (f *fakeService) HibernateSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	s := sandbox(id)
	s.State = api.StateHibernated
	return s, f.call("HibernateSandbox", id)
}

func (f *fakeService) SandboxTransitions(ctx context.Context, id string) ([]api.Transition, error) {
	return []api.Transition{{From: "creating", To: "running", Cause: api.CauseCreate}}, f.call("SandboxTransitions", id)
}

func TestLifecycleRoutes(t *testing.T) {
	cases := []routeCase{
		{"POST", "/v1/sandboxes/sb1/pause", ``, nil, 200, "PauseSandbox", []any{"sb1"}},
		{"POST", "/v1/sandboxes/sb1/pause", ``, fmt.Errorf("hibernated: %w", errdefs.ErrConflict), 409, "PauseSandbox", nil},
		{"POST", "/v1/sandboxes/sb1/resume", ``, nil, 200, "ResumeSandbox", []any{"sb1"}},
		{"POST", "/v1/sandboxes/sb1/hibernate", ``, nil, 200, "HibernateSandbox", []any{"sb1"}},
		{"POST", "/v1/sandboxes/SB!/hibernate", ``, nil, 400, "", nil},
		{"GET", "/v1/sandboxes/sb1/transitions", ``, nil, 200, "SandboxTransitions", []any{"sb1"}},
		{"GET", "/v1/sandboxes/sb1/transitions", ``, fmt.Errorf("gone: %w", errdefs.ErrNotFound), 404, "SandboxTransitions", nil},
		{"POST", "/v1/sandboxes", `{"name":"fresh","lifecycle":"persistent","idle":{"pause_after_seconds":-1}}`, nil, 201, "CreateSandbox",
			[]any{api.CreateSandboxRequest{Name: "fresh", Lifecycle: "persistent", Idle: &api.IdlePolicy{PauseAfterSeconds: -1}}}},
		{"POST", "/v1/sandboxes", `{"name":"existing","lifecycle":"persistent"}`, nil, 200, "CreateSandbox", nil},
		{"POST", "/v1/sandboxes", `{"name":"` + strings.Repeat("x", 65) + `"}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes", `{"idle":{"pause_after":5}}`, nil, 400, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			_, rec, called := tc.serve(t)
			if !called {
				return
			}
			if tc.status == 200 && strings.HasSuffix(tc.path, "/transitions") {
				var tl api.TransitionList
				if err := json.Unmarshal(rec.Body.Bytes(), &tl); err != nil || len(tl.Transitions) != 1 {
					t.Fatalf("body %q: %v", rec.Body, err)
				}
			}
		})
	}
}

// A Service without the lifecycle interface has no lifecycle routes and
// creates answer 201.
func TestLifecycleRoutesOptional(t *testing.T) {
	type plain struct{ Service }
	h := New(plain{&fakeService{}}, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/sandboxes/sb1/pause", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"name":"existing"}`)))
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d, want 201", rec.Code)
	}
}

func TestOpenAPILifecycleSchemas(t *testing.T) {
	doc := loadSpec(t)
	for _, v := range []any{api.IdlePolicy{}, api.Transition{}, api.TransitionList{}} {
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
