package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/validate"
)

func (h *handler) health(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (h *handler) info(w http.ResponseWriter, r *http.Request) error {
	info, err := h.svc.Info(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (h *handler) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(api.OpenAPI)))
	_, _ = w.Write(api.OpenAPI)
	return nil
}

// --- sandboxes ---

func (h *handler) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := validCreate(&req); err != nil {
		return err
	}
	sb, status, err := h.create(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, status, sb)
	return nil
}

func validCreate(req *api.CreateSandboxRequest) error {
	if req.Template != "" && !templateNameRe.MatchString(req.Template) {
		return errorf("invalid template name %q", clip(req.Template))
	}
	if err := validEnv("env", req.Env); err != nil {
		return err
	}
	if err := validate.Labels(req.Labels); err != nil {
		return fmt.Errorf("labels: %w", err)
	}
	res := req.Resources
	if res.CPUs < 0 || res.MemoryBytes < 0 || res.PidsMax < 0 || req.TimeoutSeconds < 0 {
		return errorf("resources and timeout_seconds must not be negative")
	}
	if len(req.Hostname) > 64 {
		return errorf("hostname longer than 64 bytes")
	}
	return noNUL("hostname", req.Hostname)
}

func (h *handler) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	labels, err := labelsQuery(r)
	if err != nil {
		return err
	}
	sbs, err := h.svc.ListSandboxes(r.Context(), labels)
	if err != nil {
		return err
	}
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sbs})
	return nil
}

func (h *handler) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	sb, err := h.svc.GetSandbox(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (h *handler) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	if err := h.svc.DeleteSandbox(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// --- processes (exec and attach are in stream.go) ---

func (h *handler) listProcesses(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	ps, err := h.svc.ListProcesses(r.Context(), id)
	if err != nil {
		return err
	}
	if ps == nil {
		ps = []api.Process{}
	}
	writeJSON(w, http.StatusOK, api.ProcessList{Processes: ps})
	return nil
}

// idPid validates the {id} and {pid} path values.
func idPid(r *http.Request) (string, int, error) {
	id, err := sandboxID(r)
	if err != nil {
		return "", 0, err
	}
	pid, err := pidParam(r)
	return id, pid, err
}

func (h *handler) stdin(w http.ResponseWriter, r *http.Request) error {
	id, pid, err := idPid(r)
	if err != nil {
		return err
	}
	closeAfter, err := boolQuery(r, "close")
	if err != nil {
		return err
	}
	if err := h.svc.WriteStdin(r.Context(), id, pid, h.uploadBody(w, r), closeAfter); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) signal(w http.ResponseWriter, r *http.Request) error {
	id, pid, err := idPid(r)
	if err != nil {
		return err
	}
	var req api.SignalRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Signal == "" || len(req.Signal) > 32 {
		return errorf("signal is required")
	}
	if err := h.svc.Signal(r.Context(), id, pid, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) resize(w http.ResponseWriter, r *http.Request) error {
	id, pid, err := idPid(r)
	if err != nil {
		return err
	}
	var req api.ResizeRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validTTY(req); err != nil {
		return err
	}
	if err := h.svc.Resize(r.Context(), id, pid, req); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// --- files ---

// uploadBody is a streamed request body, capped only by MaxUploadBytes.
func (h *handler) uploadBody(w http.ResponseWriter, r *http.Request) io.Reader {
	if h.opts.MaxUploadBytes > 0 {
		return http.MaxBytesReader(w, r.Body, h.opts.MaxUploadBytes)
	}
	return r.Body
}

// A refused upload's remaining body is read and discarded, up to
// uploadDrainBytes and for at most uploadDrainTime, before the error is
// sent: clients that read the response only after sending the whole body
// (Go's net/http, Python's requests) then see the status (a 429 for a full
// disk, a 400 for a refused archive entry) instead of a broken pipe. A
// longer body still ends in a closed connection.
const (
	uploadDrainBytes = 64 << 20
	uploadDrainTime  = 5 * time.Second
)

// drainRefused drains what is left of r's body (bounded) and returns err,
// the refusal for handle to send. The connection is not reused: its read
// deadline was changed.
func drainRefused(w http.ResponseWriter, r *http.Request, err error) error {
	if r.Context().Err() == nil {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDrainTime))
		_, _ = io.CopyN(io.Discard, r.Body, uploadDrainBytes)
		w.Header().Set("Connection", "close")
	}
	return err
}

// idPath validates {id} and ?path=.
func idPath(r *http.Request) (string, string, error) {
	id, err := sandboxID(r)
	if err != nil {
		return "", "", err
	}
	p, err := pathQuery(r)
	return id, p, err
}

func (h *handler) readFile(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	rc, fi, err := h.svc.ReadFile(r.Context(), id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	hdr.Set("X-Agentbox-Mode", fmt.Sprintf("%04o", fi.Mode))
	if !fi.ModTime.IsZero() {
		hdr.Set("Last-Modified", fi.ModTime.UTC().Format(http.TimeFormat))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	// Copy exactly Size bytes: a file that grew is cut at the announced
	// length, one that shrank leaves a short body the client detects
	// (handle aborts the response on an error from here on).
	if n, err := io.CopyN(w, rc, fi.Size); err != nil {
		return fmt.Errorf("sending file after %d of %d bytes: %w", n, fi.Size, err)
	}
	return nil
}

func (h *handler) writeFile(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	mode, err := modeQuery(r)
	if err != nil {
		return err
	}
	parents, err := boolQuery(r, "parents")
	if err != nil {
		return err
	}
	fi, err := h.svc.WriteFile(r.Context(), id, p, mode, parents, h.uploadBody(w, r))
	if err != nil {
		return drainRefused(w, r, err)
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (h *handler) stat(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	fi, err := h.svc.Stat(r.Context(), id, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	entries, err := h.svc.List(r.Context(), id, p)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []api.FileInfo{}
	}
	writeJSON(w, http.StatusOK, api.FileList{Entries: entries})
	return nil
}

func (h *handler) mkdir(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.MkdirRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validPath("path", req.Path); err != nil {
		return err
	}
	if req.Mode > 0o7777 {
		return errorf("mode %#o: want permission bits (at most 07777)", req.Mode)
	}
	fi, err := h.svc.Mkdir(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, fi)
	return nil
}

func (h *handler) move(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.MoveRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := errors.Join(validPath("from", req.From), validPath("to", req.To)); err != nil {
		return err
	}
	if err := h.svc.Move(r.Context(), id, req); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) remove(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	recursive, err := boolQuery(r, "recursive")
	if err != nil {
		return err
	}
	if err := h.svc.Remove(r.Context(), id, p, recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) readArchive(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	rc, err := h.svc.ReadArchive(r.Context(), id, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Chunked and already 200: handle aborts so the client sees a
		// broken transfer rather than a truncated but complete-looking tar.
		return fmt.Errorf("sending archive: %w", err)
	}
	return nil
}

func (h *handler) writeArchive(w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	if err := h.svc.WriteArchive(r.Context(), id, p, h.uploadBody(w, r)); err != nil {
		return drainRefused(w, r, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// --- templates (build is in stream.go) ---

func (h *handler) getTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !templateNameRe.MatchString(name) {
		return errorf("invalid template name %q", clip(name))
	}
	t, err := h.svc.GetTemplate(r.Context(), name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}
