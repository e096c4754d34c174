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

func (s storageHandlers) gc(w http.ResponseWriter, r *http.Request) error {
	var req api.GCRequest
	if err := s.h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	minAge := defaultGCMinAge
	if req.MinAgeSeconds != nil {
		if *req.MinAgeSeconds < 0 {
			return errorf("min_age_seconds must not be negative")
		}
		minAge = time.Duration(*req.MinAgeSeconds) * time.Second
	}
	res, err := s.svc.CollectGarbage(r.Context(), minAge)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s storageHandlers) exportTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !templateNameRe.MatchString(name) {
		return errorf("invalid template name %q", clip(name))
	}
	rc, err := s.svc.ExportTemplate(r.Context(), name)
	if err != nil {
		return err
	}
	return sendImage(w, rc, name)
}

func (s storageHandlers) exportCheckpoint(w http.ResponseWriter, r *http.Request) error {
	cid, err := checkpointID(r)
	if err != nil {
		return err
	}
	rc, err := s.svc.ExportCheckpoint(r.Context(), cid)
	if err != nil {
		return err
	}
	return sendImage(w, rc, "checkpoint-"+cid)
}

// sendImage sends the image archive rc as the download name.tar and closes
// rc.
func sendImage(w http.ResponseWriter, rc io.ReadCloser, name string) error {
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name + ".tar"}))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Already 200: handle aborts so the client sees a broken transfer.
		return fmt.Errorf("sending image: %w", err)
	}
	return nil
}

func (s storageHandlers) importTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.URL.Query().Get("name")
	if !templateNameRe.MatchString(name) {
		return errorf("query parameter name must be a template name, got %q", clip(name))
	}
	var (
		t   api.Template
		err error
	)
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" {
		var req api.ImportTemplateRequest
		if err := s.h.decodeJSON(w, r, &req, false); err != nil {
			return err
		}
		if req.Path == "" || req.Path[0] != '/' || len(req.Path) > 4096 {
			return errorf("path must be an absolute directory path on the daemon host")
		}
		t, err = s.svc.ImportTemplatePath(r.Context(), name, req.Path)
	} else {
		t, err = s.svc.ImportTemplate(r.Context(), name, s.h.uploadBody(w, r))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, t)
	return nil
}
