package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

func (f *fakeService) Replay(ctx context.Context, id string, req api.ReplayRequest) (api.ReplayResult, error) {
	if err := f.call("Replay", id, req.Checkpoint); err != nil {
		return api.ReplayResult{}, err
	}
	zero := 0
	return api.ReplayResult{Sandbox: id, Checkpoint: req.Checkpoint, Fork: "fork1", Steps: []api.ReplayStep{{Index: 0, Diverged: true, Differences: []string{"exit"}}}, Diverged: true, FirstDivergence: &zero}, nil
}

func (f *fakeService) Compare(ctx context.Context, a, b string) (api.CompareResult, error) {
	if err := f.call("Compare", a, b); err != nil {
		return api.CompareResult{}, err
	}
	return api.CompareResult{A: a, B: b, Steps: []api.CompareStep{}}, nil
}

func (f *fakeService) RunReport(ctx context.Context, id, run string) (api.RunSummary, error) {
	if err := f.call("RunReport", id, run); err != nil {
		return api.RunSummary{}, err
	}
	return api.RunSummary{Run: run, Command: "make report"}, nil
}

func TestReplayRoutes(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{})
	do := func(method, target, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	w := do("POST", "/v1/sandboxes/sb1/replay", `{"checkpoint":"ck1"}`)
	var res api.ReplayResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); w.Code != 200 || err != nil || res.FirstDivergence == nil || *res.FirstDivergence != 0 {
		t.Fatalf("replay: %d %s", w.Code, w.Body)
	}
	for _, bad := range []string{`{}`, `{"checkpoint":"ck1","ignore_paths":["tmp"]}`, `{"checkpoint":"ck1","bogus":1}`} {
		if w := do("POST", "/v1/sandboxes/sb1/replay", bad); w.Code != http.StatusBadRequest {
			t.Fatalf("replay %s: %d %s", bad, w.Code, w.Body)
		}
	}
	if w := do("GET", "/v1/compare?a=sb1&b=sb2", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"b":"sb2"`) {
		t.Fatalf("compare: %d %s", w.Code, w.Body)
	}
	if w := do("GET", "/v1/compare?a=sb1", ""); w.Code != http.StatusBadRequest {
		t.Fatalf("compare without b: %d", w.Code)
	}
	// Every artifact is marked as sandbox output, in headers and body.
	for _, target := range []string{"/v1/sandboxes/sb1/artifacts/file?path=/out/r.txt", "/v1/sandboxes/sb1/artifacts/diff?from=checkpoint:ck1", "/v1/sandboxes/sb1/artifacts/report?run=run1"} {
		w := do("GET", target, "")
		if w.Code != 200 || w.Header().Get(api.UntrustedHeader) != api.UntrustedSandboxOutput || w.Header().Get(api.OriginHeader) != "sandbox:sb1" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: %d %v", target, w.Code, w.Header())
		}
		if strings.Contains(target, "/file") {
			if w.Body.String() != "hello" || !strings.HasPrefix(w.Header().Get("Content-Disposition"), "attachment") {
				t.Fatalf("file artifact: %q %v", w.Body, w.Header())
			}
			continue
		}
		var a api.Artifact
		if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil || !a.Untrusted || a.Origin != "sandbox:sb1" {
			t.Fatalf("%s: %s", target, w.Body)
		}
	}
	if got := safeFilename(`a"b\n;c.txt`); got != "a_b_n_c.txt" {
		t.Fatalf("safeFilename: %q", got)
	}
}

// The wire types of replay, compare and artifacts match their schemas.
func TestOpenAPIReplaySchemas(t *testing.T) {
	doc := loadSpec(t)
	for _, v := range []any{api.ReplayRequest{}, api.RunSummary{}, api.ReplayStep{}, api.ReplayResult{}, api.CompareStep{}, api.CompareResult{}, api.Artifact{}} {
		rt := reflect.TypeOf(v)
		s, ok := doc.Components.Schemas[rt.Name()]
		if !ok {
			t.Errorf("schema %s missing", rt.Name())
			continue
		}
		fields := map[string]bool{}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous || name == "-" {
				continue
			}
			fields[name] = true
			if _, ok := s.Properties[name]; !ok {
				t.Errorf("%s: field %q not in schema", rt.Name(), name)
			}
		}
		for p := range s.Properties {
			if !fields[p] {
				t.Errorf("%s: schema property %q not in the type", rt.Name(), p)
			}
		}
	}
}
