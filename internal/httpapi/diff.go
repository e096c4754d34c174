package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// DiffService is implemented by a Service that can compare filesystem
// states; its routes exist only then. Refs are as in api.Diff (validated
// for length and NUL bytes only).
type DiffService interface {
	// Diff compares two states (see api.DiffOptions).
	Diff(ctx context.Context, from, to string, opts api.DiffOptions) (api.Diff, error)
	// TreeHash hashes a sandbox's filesystem as seen from inside.
	TreeHash(ctx context.Context, id string) (api.TreeHash, error)
}

// MergeService is implemented by a Service that can merge sandboxes.
type MergeService interface {
	// Merge applies req.From's changes since the common fork point to
	// sandbox id. Unresolved conflicts: the result carries them and the
	// error wraps errdefs.ErrConflict; nothing was applied.
	Merge(ctx context.Context, id string, req api.MergeRequest) (api.MergeResult, error)
}

// TemplateSaveService is implemented by a Service that can freeze a
// sandbox as a versioned template.
type TemplateSaveService interface {
	SaveTemplate(ctx context.Context, id string, req api.SaveTemplateRequest) (api.TemplateVersion, error)
	TemplateVersions(ctx context.Context, name string) ([]api.TemplateVersion, error)
}

// maxRefLen bounds a diff ref ("checkpoint:" plus a name of 128 bytes...).
const maxRefLen = 300

// diffRoutes are the routes of the services above that svc implements.
func (h *handler) diffRoutes() []route {
	var out []route
	if ds, ok := h.svc.(DiffService); ok {
		out = append(out,
			route{"GET", "/v1/diff", func(w http.ResponseWriter, r *http.Request) error { return diff(ds, w, r) }},
			route{"GET", "/v1/sandboxes/{id}/treehash", func(w http.ResponseWriter, r *http.Request) error { return treeHash(ds, w, r) }},
		)
	}
	if ms, ok := h.svc.(MergeService); ok {
		out = append(out, route{"POST", "/v1/sandboxes/{id}/merge", func(w http.ResponseWriter, r *http.Request) error { return h.merge(ms, w, r) }})
	}
	if ts, ok := h.svc.(TemplateSaveService); ok {
		out = append(out,
			route{"POST", "/v1/sandboxes/{id}/template", func(w http.ResponseWriter, r *http.Request) error { return h.saveTemplate(ts, w, r) }},
			route{"GET", "/v1/templates/{name}/versions", func(w http.ResponseWriter, r *http.Request) error { return templateVersions(ts, w, r) }},
		)
	}
	return out
}

func diffRef(r *http.Request, name string) (string, error) {
	ref := r.URL.Query().Get(name)
	if ref == "" || len(ref) > maxRefLen || !validText(ref) {
		return "", errorf("%s must be a ref of at most %d bytes: sandbox:<id|name>, checkpoint:<id|name> or template:<name>", name, maxRefLen)
	}
	// A sandbox's name designates it as its id does; a bare ref that is
	// one of the caller's sandbox names is that sandbox (bare refs look
	// for a sandbox first).
	switch kind, sb, ok := strings.Cut(ref, ":"); {
	case ok && kind == "sandbox":
		ref = "sandbox:" + resolveSandbox(r, sb)
	case !ok:
		if id := resolveSandbox(r, ref); id != ref {
			ref = "sandbox:" + id
		}
	}
	return ref, nil
}

// validText: no NUL bytes or line breaks.
func validText(s string) bool {
	for _, c := range s {
		if c == 0 || c == '\n' || c == '\r' {
			return false
		}
	}
	return true
}

func diff(ds DiffService, w http.ResponseWriter, r *http.Request) error {
	from, err := diffRef(r, "from")
	if err != nil {
		return err
	}
	to, err := diffRef(r, "to")
	if err != nil {
		return err
	}
	var opts api.DiffOptions
	for _, b := range []struct {
		name string
		p    *bool
	}{{"unified", &opts.Unified}, {"include_identity", &opts.IncludeIdentity}} {
		if v := r.URL.Query().Get(b.name); v != "" {
			if *b.p, err = strconv.ParseBool(v); err != nil {
				return errorf("%s must be true or false", b.name)
			}
		}
	}
	d, err := ds.Diff(r.Context(), from, to, opts)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func treeHash(ds DiffService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	th, err := ds.TreeHash(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, th)
	return nil
}

func (h *handler) merge(ms MergeService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.MergeRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if !sandboxIDRe.MatchString(req.From) {
		return errorf("from must be a sandbox id or name")
	}
	req.From = resolveSandbox(r, req.From)
	res, err := ms.Merge(r.Context(), id, req)
	if err != nil && errors.Is(err, errdefs.ErrConflict) && len(res.Conflicts) > 0 {
		// The conflicts are the answer: send them with the error.
		return withErrorBody(err, func(e api.Error) any {
			return api.MergeConflictError{Error: e, Conflicts: res.Conflicts}
		})
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (h *handler) saveTemplate(ts TemplateSaveService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.SaveTemplateRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if !templateNameRe.MatchString(req.Name) {
		return errorf("invalid template name %q", clip(req.Name))
	}
	v, err := ts.SaveTemplate(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func templateVersions(ts TemplateSaveService, w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !templateNameRe.MatchString(name) {
		return errorf("invalid template name %q", clip(name))
	}
	vs, err := ts.TemplateVersions(r.Context(), name)
	if err != nil {
		return err
	}
	if vs == nil {
		vs = []api.TemplateVersion{}
	}
	writeJSON(w, http.StatusOK, api.TemplateVersionList{Versions: vs})
	return nil
}
