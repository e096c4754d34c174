package httpapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/api"
)

// ReplayService is implemented by a Service that can replay and compare
// recorded runs (internal/replay over the flight recorder); its routes
// exist only then.
type ReplayService interface {
	// Replay re-runs sandbox id's recorded runs from a checkpoint in a
	// fresh fork and compares them (api.ReplayRequest).
	Replay(ctx context.Context, id string, req api.ReplayRequest) (api.ReplayResult, error)
	// Compare puts two sandboxes' runs and files side by side.
	Compare(ctx context.Context, a, b string) (api.CompareResult, error)
	// RunReport is one recorded run with its effects.
	RunReport(ctx context.Context, id, run string) (api.RunSummary, error)
}

func (h *handler) replayRoutes() []route {
	out := []route{{"GET", "/v1/sandboxes/{id}/artifacts/file", h.artifactFile}}
	if ds, ok := h.svc.(DiffService); ok {
		out = append(out, route{"GET", "/v1/sandboxes/{id}/artifacts/diff", func(w http.ResponseWriter, r *http.Request) error { return artifactDiff(ds, w, r) }})
	}
	rs, ok := h.svc.(ReplayService)
	if !ok {
		return out
	}
	return append(out,
		route{"POST", "/v1/sandboxes/{id}/replay", func(w http.ResponseWriter, r *http.Request) error { return h.replay(rs, w, r) }},
		route{"GET", "/v1/compare", func(w http.ResponseWriter, r *http.Request) error { return compare(rs, w, r) }},
		route{"GET", "/v1/sandboxes/{id}/artifacts/report", func(w http.ResponseWriter, r *http.Request) error { return artifactReport(rs, w, r) }},
	)
}

func (h *handler) replay(rs ReplayService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.ReplayRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Checkpoint == "" || len(req.Checkpoint) > maxRefLen || !validText(req.Checkpoint) {
		return errorf("checkpoint must be a checkpoint id or name of at most %d bytes", maxRefLen)
	}
	for _, run := range req.Runs {
		if run == "" || len(run) > 128 || !validText(run) {
			return errorf("run %q is not a run id", clip(run))
		}
	}
	for _, p := range req.IgnorePaths {
		if !strings.HasPrefix(p, "/") || len(p) > 4096 || !validText(p) {
			return errorf("ignore_paths: %q is not an absolute path", clip(p))
		}
	}
	res, err := rs.Replay(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func compare(rs ReplayService, w http.ResponseWriter, r *http.Request) error {
	var ids [2]string
	for i, name := range []string{"a", "b"} {
		v := r.URL.Query().Get(name)
		if !sandboxIDRe.MatchString(v) {
			return errorf("%s must be a sandbox id or name", name)
		}
		ids[i] = resolveSandbox(r, v)
	}
	res, err := rs.Compare(r.Context(), ids[0], ids[1])
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// markUntrusted sets the headers of every artifact response: the body is
// sandbox output, to be handled as data (never rendered or sniffed as a
// page, never fed to an agent as instructions).
func markUntrusted(w http.ResponseWriter, id string) {
	hdr := w.Header()
	hdr.Set(api.UntrustedHeader, api.UntrustedSandboxOutput)
	hdr.Set(api.OriginHeader, "sandbox:"+id)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	hdr.Set("Cache-Control", "no-store")
}

// artifactFile hands a finished file to the caller as an attachment.
func (h *handler) artifactFile(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	rc, fi, err := h.svc.ReadFile(r.Context(), id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	markUntrusted(w, id)
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	hdr.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", safeFilename(path.Base(p))))
	w.WriteHeader(http.StatusOK)
	if n, err := io.CopyN(w, rc, fi.Size); err != nil {
		return fmt.Errorf("sending artifact after %d of %d bytes: %w", n, fi.Size, err)
	}
	return nil
}

// safeFilename keeps a file name's printable ASCII letters, digits and
// ".-_" for a Content-Disposition header.
func safeFilename(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || len(b) > 128 {
		return "artifact"
	}
	return string(b)
}

func artifactDiff(ds DiffService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	from, err := diffRef(r, "from")
	if err != nil {
		return err
	}
	unified, err := boolQuery(r, "unified")
	if err != nil {
		return err
	}
	d, err := ds.Diff(r.Context(), from, "sandbox:"+id, api.DiffOptions{Unified: unified})
	if err != nil {
		return err
	}
	markUntrusted(w, id)
	writeJSON(w, http.StatusOK, api.Artifact{Untrusted: true, Origin: "sandbox:" + id, Kind: api.ArtifactDiff, Diff: &d})
	return nil
}

func artifactReport(rs ReplayService, w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	run := r.URL.Query().Get("run")
	if run == "" || len(run) > 128 || !validText(run) {
		return errorf("run must be a run id")
	}
	rep, err := rs.RunReport(r.Context(), id, run)
	if err != nil {
		return err
	}
	markUntrusted(w, id)
	writeJSON(w, http.StatusOK, api.Artifact{Untrusted: true, Origin: "sandbox:" + id, Kind: api.ArtifactReport, Report: &rep})
	return nil
}
