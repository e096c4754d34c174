package agentboxtest

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
)

var (
	errNotExist = errors.New("no such file or directory")
	errExist    = errors.New("file exists")
)

type node struct {
	dir   bool
	data  []byte
	mode  uint32
	mtime time.Time
}

// memFS is a sandbox's in-memory filesystem, keyed by clean absolute path.
type memFS struct {
	mu    sync.Mutex // guards nodes
	nodes map[string]*node
}

func newMemFS() *memFS {
	now := time.Now().UTC()
	return &memFS{nodes: map[string]*node{
		"/": {dir: true, mode: 0o755, mtime: now}, "/root": {dir: true, mode: 0o700, mtime: now},
		"/tmp": {dir: true, mode: 0o1777, mtime: now},
	}}
}

func (m *memFS) info(p string, n *node) api.FileInfo {
	fi := api.FileInfo{Name: path.Base(p), Path: p, Type: api.FileTypeFile, Size: int64(len(n.data)), Mode: n.mode, ModTime: n.mtime}
	if n.dir {
		fi.Type, fi.Size = api.FileTypeDir, 4096
	}
	return fi
}

func (m *memFS) stat(p string) (api.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return api.FileInfo{}, fmt.Errorf("stat %s: %w", p, errNotExist)
	}
	return m.info(p, n), nil
}

// mkdirLocked creates p (and parents when set). m.mu must be held.
func (m *memFS) mkdirLocked(p string, mode uint32, parents bool) error {
	if n, ok := m.nodes[p]; ok {
		if n.dir && parents {
			return nil
		}
		return fmt.Errorf("mkdir %s: %w", p, errExist)
	}
	parent := path.Dir(p)
	if pn, ok := m.nodes[parent]; !ok {
		if !parents {
			return fmt.Errorf("mkdir %s: %w", parent, errNotExist)
		}
		if err := m.mkdirLocked(parent, 0o755, true); err != nil {
			return err
		}
	} else if !pn.dir {
		return fmt.Errorf("mkdir %s: parent is not a directory", p)
	}
	m.nodes[p] = &node{dir: true, mode: mode, mtime: time.Now().UTC()}
	return nil
}

func (m *memFS) mkdir(p string, mode uint32, parents bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mkdirLocked(p, mode, parents)
}

func (m *memFS) writeFile(p string, r io.Reader, mode uint32, parents bool) error {
	data, err := io.ReadAll(r) // read before locking: the body streams in
	if err != nil {
		return fmt.Errorf("reading content of %s: %w", p, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.nodes[p]; ok && n.dir {
		return fmt.Errorf("write %s: is a directory", p)
	}
	if _, ok := m.nodes[path.Dir(p)]; !ok {
		if !parents {
			return fmt.Errorf("write %s: %w", path.Dir(p), errNotExist)
		}
		if err := m.mkdirLocked(path.Dir(p), 0o755, true); err != nil {
			return err
		}
	}
	m.nodes[p] = &node{data: data, mode: mode, mtime: time.Now().UTC()}
	return nil
}

func (m *memFS) readFile(p string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[p]
	if !ok {
		return nil, fmt.Errorf("open %s: %w", p, errNotExist)
	}
	if n.dir {
		return nil, fmt.Errorf("read %s: is a directory", p)
	}
	return append([]byte(nil), n.data...), nil
}

// below returns the paths strictly below directory p, sorted.
func (m *memFS) belowLocked(p string) []string {
	prefix := strings.TrimSuffix(p, "/") + "/"
	var out []string
	for q := range m.nodes {
		if strings.HasPrefix(q, prefix) {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

func (s *Server) fileRoutes(mux *http.ServeMux) {
	withPath := func(h func(http.ResponseWriter, *http.Request, *Sandbox, string)) http.HandlerFunc {
		return s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
			p, err := cleanPath(r.URL.Query().Get("path"))
			if err != nil {
				writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
				return
			}
			h(w, r, sb, p)
		})
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", withPath(func(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
		fi, err := sb.fs.stat(p)
		if err != nil {
			errorFor(w, err)
			return
		}
		b, err := sb.fs.readFile(p)
		if err != nil {
			errorFor(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Header().Set("X-Agentbox-Mode", fmt.Sprintf("%04o", fi.Mode))
		_, _ = w.Write(b)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", withPath(func(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
		mode := uint64(0o644)
		if m := r.URL.Query().Get("mode"); m != "" {
			var err error
			if mode, err = strconv.ParseUint(m, 8, 32); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_argument", "bad mode "+m)
				return
			}
		}
		if err := sb.fs.writeFile(p, r.Body, uint32(mode), r.URL.Query().Get("parents") == "true"); err != nil {
			errorFor(w, err)
			return
		}
		fi, _ := sb.fs.stat(p)
		writeJSON(w, http.StatusOK, fi)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", withPath(func(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
		fi, err := sb.fs.stat(p)
		if err != nil {
			errorFor(w, err)
			return
		}
		writeJSON(w, http.StatusOK, fi)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/list", withPath(func(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
		m := sb.fs
		m.mu.Lock()
		n, ok := m.nodes[p]
		list := api.FileList{Entries: []api.FileInfo{}}
		if ok && n.dir {
			for _, q := range m.belowLocked(p) {
				if path.Dir(q) == p {
					list.Entries = append(list.Entries, m.info(q, m.nodes[q]))
				}
			}
		}
		m.mu.Unlock()
		if !ok || !n.dir {
			errorFor(w, fmt.Errorf("list %s: %w", p, errNotExist))
			return
		}
		writeJSON(w, http.StatusOK, list)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/mkdir", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		var req api.MkdirRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", "bad mkdir request")
			return
		}
		p, err := cleanPath(req.Path)
		if err == nil {
			if req.Mode == 0 {
				req.Mode = 0o755
			}
			err = sb.fs.mkdir(p, req.Mode, req.Parents)
		}
		if err != nil {
			errorFor(w, err)
			return
		}
		fi, _ := sb.fs.stat(p)
		writeJSON(w, http.StatusCreated, fi)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/move", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		var req api.MoveRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		from, err1 := cleanPath(req.From)
		to, err2 := cleanPath(req.To)
		if err := errors.Join(err1, err2); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
			return
		}
		m := sb.fs
		m.mu.Lock()
		n, ok := m.nodes[from]
		if ok {
			for _, q := range m.belowLocked(from) {
				m.nodes[to+strings.TrimPrefix(q, from)] = m.nodes[q]
				delete(m.nodes, q)
			}
			delete(m.nodes, from)
			m.nodes[to] = n
		}
		m.mu.Unlock()
		if !ok {
			errorFor(w, fmt.Errorf("move %s: %w", from, errNotExist))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/fs", withPath(func(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
		m := sb.fs
		m.mu.Lock()
		_, ok := m.nodes[p]
		below := m.belowLocked(p)
		recursive := r.URL.Query().Get("recursive") == "true"
		if ok && (len(below) == 0 || recursive) {
			for _, q := range below {
				delete(m.nodes, q)
			}
			delete(m.nodes, p)
		}
		m.mu.Unlock()
		switch {
		case !ok:
			errorFor(w, fmt.Errorf("remove %s: %w", p, errNotExist))
		case len(below) > 0 && !recursive:
			writeError(w, http.StatusConflict, "conflict", "directory "+p+" is not empty")
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/archive", withPath(s.getArchive))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/fs/archive", withPath(s.putArchive))
}

func (s *Server) getArchive(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
	m := sb.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.nodes[p]; !ok || !n.dir {
		writeError(w, http.StatusNotFound, "not_found", "directory "+p+" not found")
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	for _, q := range m.belowLocked(p) {
		n := m.nodes[q]
		name := strings.TrimPrefix(q, strings.TrimSuffix(p, "/")+"/")
		h := &tar.Header{Name: name, Mode: int64(n.mode), ModTime: n.mtime, Typeflag: tar.TypeReg, Size: int64(len(n.data))}
		if n.dir {
			h.Name, h.Typeflag, h.Size = name+"/", tar.TypeDir, 0
		}
		if tw.WriteHeader(h) != nil {
			return
		}
		if _, err := tw.Write(n.data); err != nil {
			return
		}
	}
	_ = tw.Close()
}

func (s *Server) putArchive(w http.ResponseWriter, r *http.Request, sb *Sandbox, p string) {
	if err := sb.fs.mkdir(p, 0o755, true); err != nil {
		errorFor(w, err)
		return
	}
	tr := tar.NewReader(r.Body)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", "reading archive: "+err.Error())
			return
		}
		rel := path.Clean("/" + h.Name) // confines every entry below p
		dst := path.Join(p, rel)
		switch h.Typeflag {
		case tar.TypeDir:
			err = sb.fs.mkdir(dst, uint32(h.Mode)&0o7777, true)
		case tar.TypeReg:
			err = sb.fs.writeFile(dst, tr, uint32(h.Mode)&0o7777, true)
		default:
			continue // links and devices are not modelled
		}
		if err != nil {
			errorFor(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
