package httpapi

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/agentbox/agentbox/api"
)

// StorageService is implemented by a Service that manages layer storage:
// garbage collection and OCI image export/import. Its routes exist only
// then. The contract of Service applies.
type StorageService interface {
	// CollectGarbage removes layers nothing uses that are older than
	// minAge.
	CollectGarbage(ctx context.Context, minAge time.Duration) (api.GCResult, error)
	// ExportTemplate and ExportCheckpoint return an OCI image archive
	// (tar), fully prepared: reading it fails only on I/O errors. The
	// caller closes it.
	ExportTemplate(ctx context.Context, name string) (io.ReadCloser, error)
	ExportCheckpoint(ctx context.Context, cid string) (io.ReadCloser, error)
	// ImportTemplate creates or replaces template name from an image
	// archive streamed in r (OCI image archive or `docker save`).
	ImportTemplate(ctx context.Context, name string, r io.Reader) (api.Template, error)
	// ImportTemplatePath does the same from an OCI image layout directory
	// on the daemon host.
	ImportTemplatePath(ctx context.Context, name, path string) (api.Template, error)
}

// defaultGCMinAge is the min age of POST /v1/gc without one.
const defaultGCMinAge = 600 * time.Second

func (h *handler) storageRoutes() []route {
	ss, ok := h.svc.(StorageService)
	if !ok {
		return nil
	}
	s := storageHandlers{h: h, svc: ss}
	return []route{
		{"POST", "/v1/gc", s.gc},
		{"GET", "/v1/templates/{name}/export", s.exportTemplate},
		{"GET", "/v1/checkpoints/{cid}/export", s.exportCheckpoint},
		{"POST", "/v1/templates/import", s.importTemplate},
	}
}

type storageHandlers struct {
	h   *handler
	svc StorageService
}

func (s storageHandlers) gc(w http.ResponseWriter, r *http.Request) {
	var req api.GCRequest
	if err := s.h.decodeJSON(w, r, &req, true); err != nil {
		writeError(w, r, err)
		return
	}
	minAge := defaultGCMinAge
	if req.MinAgeSeconds != nil {
		if *req.MinAgeSeconds < 0 {
			writeError(w, r, errorf("min_age_seconds must not be negative"))
			return
		}
		minAge = time.Duration(*req.MinAgeSeconds) * time.Second
	}
	res, err := s.svc.CollectGarbage(r.Context(), minAge)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s storageHandlers) exportTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !templateNameRe.MatchString(name) {
		writeError(w, r, errorf("invalid template name %q", clip(name)))
		return
	}
	rc, err := s.svc.ExportTemplate(r.Context(), name)
	sendImage(w, r, rc, err, name)
}

func (s storageHandlers) exportCheckpoint(w http.ResponseWriter, r *http.Request) {
	cid, err := checkpointID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rc, err := s.svc.ExportCheckpoint(r.Context(), cid)
	sendImage(w, r, rc, err, "checkpoint-"+cid)
}

func sendImage(w http.ResponseWriter, r *http.Request, rc io.ReadCloser, err error, name string) {
	if err != nil {
		writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name + ".tar"}))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Already 200: abort so the client sees a broken transfer.
		stateFrom(r.Context()).err = fmt.Errorf("sending image: %w", err)
		panic(http.ErrAbortHandler)
	}
}

func (s storageHandlers) importTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if !templateNameRe.MatchString(name) {
		writeError(w, r, errorf("query parameter name must be a template name, got %q", clip(name)))
		return
	}
	var (
		t   api.Template
		err error
	)
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" {
		var req api.ImportTemplateRequest
		if err := s.h.decodeJSON(w, r, &req, false); err != nil {
			writeError(w, r, err)
			return
		}
		if req.Path == "" || req.Path[0] != '/' || len(req.Path) > 4096 {
			writeError(w, r, errorf("path must be an absolute directory path on the daemon host"))
			return
		}
		t, err = s.svc.ImportTemplatePath(r.Context(), name, req.Path)
	} else {
		t, err = s.svc.ImportTemplate(r.Context(), name, s.h.uploadBody(w, r))
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}
