package httpapi

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional storage interface, so its
// routes are registered (and checked against the spec) in every test.
var _ StorageService = (*fakeService)(nil)

func (f *fakeService) CollectGarbage(ctx context.Context, minAge time.Duration) (api.GCResult, error) {
	if err := f.call("CollectGarbage", minAge); err != nil {
		return api.GCResult{}, err
	}
	return api.GCResult{RemovedLayers: 2, FreedBytes: 4096, Layers: 3}, nil
}

func (f *fakeService) ExportTemplate(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := f.call("ExportTemplate", name); err != nil {
		return nil, err
	}
	if name == "missing" {
		return nil, errdefs.ErrNotFound
	}
	return io.NopCloser(strings.NewReader("TAR:" + name)), nil
}

func (f *fakeService) ExportCheckpoint(ctx context.Context, cid string) (io.ReadCloser, error) {
	if err := f.call("ExportCheckpoint", cid); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("TAR:" + cid)), nil
}

func (f *fakeService) ImportTemplate(ctx context.Context, name string, r io.Reader) (api.Template, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return api.Template{}, err
	}
	f.mu.Lock()
	f.upload = b
	f.mu.Unlock()
	if err := f.call("ImportTemplate", name); err != nil {
		return api.Template{}, err
	}
	return api.Template{Name: name, Built: true}, nil
}

func (f *fakeService) ImportTemplatePath(ctx context.Context, name, path string) (api.Template, error) {
	if err := f.call("ImportTemplatePath", name, path); err != nil {
		return api.Template{}, err
	}
	return api.Template{Name: name, Built: true}, nil
}

func TestStorageRoutes(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{})

	rec := do(h, "POST", "/v1/gc", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"removed_layers":2`) {
		t.Fatalf("gc: %d %s", rec.Code, rec.Body)
	}
	if name, args := f.lastCall(); name != "CollectGarbage" || args[0] != 600*time.Second {
		t.Fatalf("gc default min age: %s %v", name, args)
	}
	if rec := do(h, "POST", "/v1/gc", `{"min_age_seconds":0}`); rec.Code != 200 {
		t.Fatalf("gc min age 0: %d", rec.Code)
	}
	if _, args := f.lastCall(); args[0] != time.Duration(0) {
		t.Fatalf("gc min age 0 passed as %v", args)
	}
	if rec := do(h, "POST", "/v1/gc", `{"min_age_seconds":-1}`); rec.Code != 400 {
		t.Fatalf("negative min age: %d", rec.Code)
	}

	rec = do(h, "GET", "/v1/templates/py/export", "")
	if rec.Code != 200 || rec.Body.String() != "TAR:py" || rec.Header().Get("Content-Type") != "application/x-tar" {
		t.Fatalf("export: %d %q %v", rec.Code, rec.Body, rec.Header())
	}
	if rec := do(h, "GET", "/v1/templates/missing/export", ""); rec.Code != 404 {
		t.Fatalf("export of a missing template: %d", rec.Code)
	}
	if rec := do(h, "GET", "/v1/checkpoints/ck1/export", ""); rec.Code != 200 || rec.Body.String() != "TAR:ck1" {
		t.Fatalf("checkpoint export: %d %q", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/v1/checkpoints/BAD!/export", ""); rec.Code != 400 {
		t.Fatalf("bad checkpoint id: %d", rec.Code)
	}

	rec = do(h, "POST", "/v1/templates/import?name=py", "ARCHIVE", "Content-Type", "application/x-tar")
	if rec.Code != 201 || string(f.upload) != "ARCHIVE" {
		t.Fatalf("import archive: %d %s upload %q", rec.Code, rec.Body, f.upload)
	}
	rec = do(h, "POST", "/v1/templates/import?name=py", `{"path":"/srv/img"}`, "Content-Type", "application/json")
	if name, args := f.lastCall(); rec.Code != 201 || name != "ImportTemplatePath" || args[1] != "/srv/img" {
		t.Fatalf("import path: %d %s %v", rec.Code, name, args)
	}
	for _, tc := range []struct{ target, body, ct string }{
		{"/v1/templates/import", "x", "application/x-tar"},
		{"/v1/templates/import?name=a/b", "x", "application/x-tar"},
		{"/v1/templates/import?name=py", `{"path":"relative"}`, "application/json"},
		{"/v1/templates/import?name=py", `{"path":"/x","extra":1}`, "application/json"},
	} {
		if rec := do(h, "POST", tc.target, tc.body, "Content-Type", tc.ct); rec.Code != 400 {
			t.Errorf("%s %s: %d, want 400", tc.target, tc.body, rec.Code)
		}
	}
}
