package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/tenant"
)

// The fake service implements the optional exposure interface, so its
// routes are registered (and checked against the spec) in every test.
var _ ExposureService = (*fakeService)(nil)

func (f *fakeService) Expose(ctx context.Context, id string, req api.ExposeRequest) (api.Exposure, error) {
	if err := f.call("Expose", id, req.Port, req.TTLSeconds); err != nil {
		return api.Exposure{}, err
	}
	return api.Exposure{ID: "abcdefghijklmnop", Sandbox: id, Port: req.Port, Token: "abt1.x"}, nil
}

func (f *fakeService) ListExposures(ctx context.Context, id string) ([]api.Exposure, error) {
	if err := f.call("ListExposures", id); err != nil {
		return nil, err
	}
	return []api.Exposure{}, nil
}

func (f *fakeService) RevokeExposure(ctx context.Context, id string) error {
	return f.call("RevokeExposure", id)
}

func (f *fakeService) ExposureLink(ctx context.Context, id string) (api.Exposure, error) {
	if err := f.call("ExposureLink", id); err != nil {
		return api.Exposure{}, err
	}
	return api.Exposure{ID: id, BrowserURL: "http://x/?agentbox_token=abl1.x"}, nil
}

func TestExposureRoutes(t *testing.T) {
	cases := []routeCase{
		{"POST", "/v1/sandboxes/sb1/exposures", `{"port":8080,"ttl_seconds":60}`, nil, 201, "Expose", []any{"sb1", 8080, int64(60)}},
		{"POST", "/v1/sandboxes/sb1/exposures", `{"port":8080,"extra":1}`, nil, 400, "", nil},
		{"POST", "/v1/sandboxes/sb1/exposures", `{"port":0}`, errdefs.ErrInvalidArgument, 400, "Expose", nil},
		{"POST", "/v1/sandboxes/nope/exposures", `{"port":80}`, errdefs.ErrNotFound, 404, "Expose", nil},
		{"GET", "/v1/exposures", ``, nil, 200, "ListExposures", []any{""}},
		{"GET", "/v1/exposures?sandbox=sb1", ``, nil, 200, "ListExposures", []any{"sb1"}},
		{"GET", "/v1/exposures?sandbox=Bad!", ``, nil, 400, "", nil},
		{"DELETE", "/v1/exposures/abcdefghijklmnop", ``, nil, 204, "RevokeExposure", []any{"abcdefghijklmnop"}},
		{"DELETE", "/v1/exposures/short", ``, nil, 400, "", nil},
		{"POST", "/v1/exposures/abcdefghijklmnop/link", ``, nil, 200, "ExposureLink", []any{"abcdefghijklmnop"}},
		{"POST", "/v1/exposures/abcdefghijklmnop/link", ``, errdefs.ErrNotFound, 404, "ExposureLink", nil},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) { tc.serve(t) })
	}
}

// fakeGateway claims the requests under /svc/ and answers them itself.
type fakeGateway struct {
	admitted []tenant.Principal
	err      error
}

func (g *fakeGateway) Match(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/sandboxes/") && strings.Contains(r.URL.Path, "/ports/")
}

func (g *fakeGateway) ServeService(w http.ResponseWriter, r *http.Request, admit func(tenant.Principal) error) error {
	if g.err != nil {
		return g.err
	}
	p := tenant.Principal{Tenant: "acme", Scope: api.ScopeFull}
	if err := admit(p); err != nil {
		return err
	}
	g.admitted = append(g.admitted, p)
	w.Header().Set("Cache-Control", "max-age=60")
	_, _ = w.Write([]byte("from the service"))
	return nil
}

// A service request on TCP needs no API key and passes no Host or Origin
// check (the gateway authenticates it); its refusal is a JSON error with
// the request id like any other; the API's own headers are not mixed
// into the service's answer.
func TestServiceRequestsBypassAPIAuth(t *testing.T) {
	g := &fakeGateway{}
	h := New(&fakeService{}, Options{RequireAuth: true, APIKeys: []string{"k"}, Services: g})
	req := httptest.NewRequest("GET", "http://evil.example/v1/sandboxes/abcdefabcdef/ports/80/x", nil)
	req.Header.Set("Origin", "http://evil.example")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Body.String() != "from the service" || len(g.admitted) != 1 {
		t.Fatalf("service request: %d %q admitted %v", rec.Code, rec.Body, g.admitted)
	}
	if cc := rec.Header().Values("Cache-Control"); len(cc) != 1 || cc[0] != "max-age=60" {
		t.Fatalf("Cache-Control %q: the API's header leaked into the service's answer", cc)
	}
	if rec.Header().Get(api.RequestIDHeader) == "" {
		t.Fatal("no request id")
	}
	g.err = errdefs.ErrNotFound
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/abcdefabcdef/ports/80/", nil))
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), `"request_id"`) {
		t.Fatalf("refusal: %d %q", rec.Code, rec.Body)
	}
	// Every other path still needs the API key.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes", nil))
	if rec.Code != 401 {
		t.Fatalf("API without a key: %d", rec.Code)
	}
}
