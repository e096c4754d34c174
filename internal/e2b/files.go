package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// envd's REST files API: GET /files?path= reads a file, POST /files?path=
// writes one (octet-stream body) or several (multipart, field "file",
// each part's file name its path when no path is given).

// writtenFile is an entry of POST /files' response.
type writtenFile struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// maxFilenameParts bounds the parts of one multipart upload.
const maxFilenameParts = 1000

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	if err := s.readFileErr(w, r); err != nil {
		writeError(w, r, s.log, err)
	}
}

func (s *Server) readFileErr(w http.ResponseWriter, r *http.Request) error {
	user, err := userOf(r)
	if err != nil {
		return err
	}
	p, err := resolvePath(r.URL.Query().Get("path"), user)
	if err != nil {
		return err
	}
	rc, fi, err := s.sb.ReadFile(r.Context(), sandboxFrom(r.Context()), p)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
	return nil
}

func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request) {
	out, err := s.writeFilesErr(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) writeFilesErr(r *http.Request) ([]writtenFile, error) {
	user, err := userOf(r)
	if err != nil {
		return nil, err
	}
	qpath := r.URL.Query().Get("path")
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, fmt.Errorf("gzip body: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		defer zr.Close()
		body = zr
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		mt = "application/octet-stream"
	}
	if mt != "multipart/form-data" {
		if qpath == "" {
			return nil, fmt.Errorf("path is required: %w", errdefs.ErrInvalidArgument)
		}
		wf, err := s.writeOne(r, qpath, user, body)
		if err != nil {
			return nil, err
		}
		return []writtenFile{wf}, nil
	}
	mr := multipart.NewReader(body, params["boundary"])
	var out []writtenFile
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("multipart body: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		if n >= maxFilenameParts {
			return nil, fmt.Errorf("more than %d files in one upload: %w", maxFilenameParts, errdefs.ErrInvalidArgument)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		p := qpath
		if p == "" {
			// The raw file name: it is a path, which FileName() would cut
			// to its base.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = dp["filename"]
		}
		if p == "" {
			return nil, fmt.Errorf("a file part has no path: %w", errdefs.ErrInvalidArgument)
		}
		wf, err := s.writeOne(r, p, user, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, wf)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no file in the upload: %w", errdefs.ErrInvalidArgument)
	}
	return out, nil
}

func (s *Server) writeOne(r *http.Request, p, user string, body io.Reader) (writtenFile, error) {
	abs, err := resolvePath(p, user)
	if err != nil {
		return writtenFile{}, err
	}
	var fi api.FileInfo
	if o, ok := s.sb.(Owners); ok && user != "root" {
		fi, err = o.WriteFileAs(r.Context(), sandboxFrom(r.Context()), abs, user, 0o644, true, body)
	} else {
		fi, err = s.sb.WriteFile(r.Context(), sandboxFrom(r.Context()), abs, 0o644, true, body)
	}
	if err != nil {
		return writtenFile{}, err
	}
	return writtenFile{Name: path.Base(abs), Type: "file", Path: fi.Path}, nil
}
