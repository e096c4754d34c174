package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the optional diff, merge and template-save
// interfaces, so their routes are registered and checked against the spec.
var (
	_ DiffService         = (*fakeService)(nil)
	_ MergeService        = (*fakeService)(nil)
	_ TemplateSaveService = (*fakeService)(nil)
)

func (f *fakeService) Diff(ctx context.Context, from, to string, opts api.DiffOptions) (api.Diff, error) {
	if err := f.call("Diff", from, to, opts.Unified); err != nil {
		return api.Diff{}, err
	}
	return api.Diff{From: from, To: to, Changes: []api.DiffChange{{Path: "/x", Change: api.ChangeAdded}}, Added: 1}, nil
}

func (f *fakeService) TreeHash(ctx context.Context, id string) (api.TreeHash, error) {
	if err := f.call("TreeHash", id); err != nil {
		return api.TreeHash{}, err
	}
	return api.TreeHash{TreeHash: "abc"}, nil
}

func (f *fakeService) Merge(ctx context.Context, id string, req api.MergeRequest) (api.MergeResult, error) {
	err := f.call("Merge", id, req)
	res := api.MergeResult{Base: "ck"}
	if errdefs.IsConflict(err) {
		res.Conflicts = []api.MergeConflict{{Path: "/both"}}
	}
	return res, err
}

func (f *fakeService) SaveTemplate(ctx context.Context, id string, req api.SaveTemplateRequest) (api.TemplateVersion, error) {
	if err := f.call("SaveTemplate", id, req); err != nil {
		return api.TemplateVersion{}, err
	}
	return api.TemplateVersion{Name: req.Name, Version: 1}, nil
}

func (f *fakeService) TemplateVersions(ctx context.Context, name string) ([]api.TemplateVersion, error) {
	if err := f.call("TemplateVersions", name); err != nil {
		return nil, err
	}
	return nil, nil
}

func TestDiffMergeRoutes(t *testing.T) {
	cases := []struct {
		method, path, body string
		err                error
		status             int
		call               string
	}{
		{"GET", "/v1/diff?from=sandbox:sb1&to=checkpoint:c1&unified=true", ``, nil, 200, "Diff"},
		{"GET", "/v1/diff?from=sandbox:sb1", ``, nil, 400, ""},
		{"GET", "/v1/diff?from=a&to=b&unified=maybe", ``, nil, 400, ""},
		{"GET", "/v1/diff?from=a%00&to=b", ``, nil, 400, ""},
		{"GET", "/v1/diff?from=a&to=b", ``, fmt.Errorf("x: %w", errdefs.ErrNotFound), 404, "Diff"},
		{"GET", "/v1/sandboxes/sb1/treehash", ``, nil, 200, "TreeHash"},
		{"POST", "/v1/sandboxes/sb1/merge", `{"from":"sb2","strategy":"theirs"}`, nil, 200, "Merge"},
		{"POST", "/v1/sandboxes/sb1/merge", `{"from":"../x"}`, nil, 400, ""},
		{"POST", "/v1/sandboxes/sb1/merge", `{"from":"sb2","bogus":1}`, nil, 400, ""},
		{"POST", "/v1/sandboxes/sb1/merge", `{"from":"sb2"}`, fmt.Errorf("conflicts: %w", errdefs.ErrConflict), 409, "Merge"},
		{"POST", "/v1/sandboxes/sb1/template", `{"name":"frozen"}`, nil, 201, "SaveTemplate"},
		{"POST", "/v1/sandboxes/sb1/template", `{"name":"bad name"}`, nil, 400, ""},
		{"GET", "/v1/templates/frozen/versions", ``, nil, 200, "TemplateVersions"},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			f := &fakeService{err: tc.err}
			h := New(f, Options{})
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if name, _ := f.lastCall(); name != tc.call {
				t.Fatalf("called %q, want %q", name, tc.call)
			}
			if tc.status == http.StatusConflict {
				var body api.MergeConflictError
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != "conflict" || len(body.Conflicts) != 1 || body.Conflicts[0].Path != "/both" {
					t.Fatalf("409 body %s (%v)", rec.Body, err)
				}
			}
		})
	}
}
