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

func (h *handler) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (h *handler) info(w http.ResponseWriter, r *http.Request) {
	info, err := h.svc.Info(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (h *handler) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Content-Length", strconv.Itoa(len(api.OpenAPI)))
	_, _ = w.Write(api.OpenAPI)
}

// --- sandboxes ---

func (h *handler) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		writeError(w, r, err)
		return
	}
	if err := validCreate(&req); err != nil {
		writeError(w, r, err)
		return
	}
	sb, status, err := h.create(r.Context(), req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, status, sb)
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

func (h *handler) listSandboxes(w http.ResponseWriter, r *http.Request) {
	labels, err := labelsQuery(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	sbs, err := h.svc.ListSandboxes(r.Context(), labels)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sbs})
}

func (h *handler) getSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	sb, err := h.svc.GetSandbox(r.Context(), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (h *handler) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.DeleteSandbox(r.Context(), id); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// --- processes (exec and attach are in stream.go) ---

func (h *handler) listProcesses(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	ps, err := h.svc.ListProcesses(r.Context(), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if ps == nil {
		ps = []api.Process{}
	}
	writeJSON(w, http.StatusOK, api.ProcessList{Processes: ps})
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

func (h *handler) stdin(w http.ResponseWriter, r *http.Request) {
	id, pid, err := idPid(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	closeAfter, err := boolQuery(r, "close")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.WriteStdin(r.Context(), id, pid, h.uploadBody(w, r), closeAfter); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) signal(w http.ResponseWriter, r *http.Request) {
	id, pid, err := idPid(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var req api.SignalRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	if req.Signal == "" || len(req.Signal) > 32 {
		writeError(w, r, errorf("signal is required"))
		return
	}
	if err := h.svc.Signal(r.Context(), id, pid, req.Signal); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) resize(w http.ResponseWriter, r *http.Request) {
	id, pid, err := idPid(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var req api.ResizeRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	if err := validTTY(req); err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.Resize(r.Context(), id, pid, req); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
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

// refuseUpload drains what is left of r's body (bounded) and writes err.
// The connection is not reused: its read deadline was changed.
func refuseUpload(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() == nil {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDrainTime))
		_, _ = io.CopyN(io.Discard, r.Body, uploadDrainBytes)
		w.Header().Set("Connection", "close")
	}
	writeError(w, r, err)
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

func (h *handler) readFile(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rc, fi, err := h.svc.ReadFile(r.Context(), id, p)
	if err != nil {
		writeError(w, r, err)
		return
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
		return
	}
	// Copy exactly Size bytes: a file that grew is cut at the announced
	// length, one that shrank leaves a short body the client detects.
	if n, err := io.CopyN(w, rc, fi.Size); err != nil {
		stateFrom(r.Context()).err = fmt.Errorf("sending file after %d of %d bytes: %w", n, fi.Size, err)
		panic(http.ErrAbortHandler)
	}
}

func (h *handler) writeFile(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	mode, err := modeQuery(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	parents, err := boolQuery(r, "parents")
	if err != nil {
		writeError(w, r, err)
		return
	}
	fi, err := h.svc.WriteFile(r.Context(), id, p, mode, parents, h.uploadBody(w, r))
	if err != nil {
		refuseUpload(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (h *handler) stat(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	fi, err := h.svc.Stat(r.Context(), id, p)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	entries, err := h.svc.List(r.Context(), id, p)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if entries == nil {
		entries = []api.FileInfo{}
	}
	writeJSON(w, http.StatusOK, api.FileList{Entries: entries})
}

func (h *handler) mkdir(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var req api.MkdirRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	if err := validPath("path", req.Path); err != nil {
		writeError(w, r, err)
		return
	}
	if req.Mode > 0o7777 {
		writeError(w, r, errorf("mode %#o: want permission bits (at most 07777)", req.Mode))
		return
	}
	fi, err := h.svc.Mkdir(r.Context(), id, req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fi)
}

func (h *handler) move(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var req api.MoveRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	if err := errors.Join(validPath("from", req.From), validPath("to", req.To)); err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.Move(r.Context(), id, req); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) remove(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	recursive, err := boolQuery(r, "recursive")
	if err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.Remove(r.Context(), id, p, recursive); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) readArchive(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	rc, err := h.svc.ReadArchive(r.Context(), id, p)
	if err != nil {
		writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Chunked and already 200: abort so the client sees a broken
		// transfer rather than a truncated but complete-looking tar.
		stateFrom(r.Context()).err = fmt.Errorf("sending archive: %w", err)
		panic(http.ErrAbortHandler)
	}
}

func (h *handler) writeArchive(w http.ResponseWriter, r *http.Request) {
	id, p, err := idPath(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.WriteArchive(r.Context(), id, p, h.uploadBody(w, r)); err != nil {
		refuseUpload(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// --- templates (build is in stream.go) ---

func (h *handler) getTemplate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !templateNameRe.MatchString(name) {
		writeError(w, r, errorf("invalid template name %q", clip(name)))
		return
	}
	t, err := h.svc.GetTemplate(r.Context(), name)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}
