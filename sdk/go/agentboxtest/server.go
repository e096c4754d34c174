// Package agentboxtest provides an in-memory fake of the agentbox daemon's
// HTTP API v1 for tests of clients (the Go SDK, the CLI). It implements every
// route of docs/CONTRACTS.md over TCP or a unix socket, with sandboxes whose
// filesystem lives in memory and whose "commands" are a tiny script language
// (see Script), so client tests need neither root nor a real sandbox.
//
// Like the SDK, it imports only the standard library and package api.
package agentboxtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Server is a running fake daemon. Its exported fields may be set before the
// first request; the methods are safe for concurrent use.
type Server struct {
	// Host is the address in AGENTBOX_HOST form: "http://127.0.0.1:port"
	// or "unix:///path".
	Host string
	// APIKey, when non-empty, is required as a bearer token on every route.
	APIKey string
	// Exec runs commands; nil means Script.
	Exec ExecFunc

	srv *httptest.Server

	// mu guards the fields below.
	mu        sync.Mutex
	nextID    int
	reqSeq    int
	sandboxes map[string]*Sandbox
	templates map[string]api.Template
	requests  []Request
}

// Request is what the fake recorded of one request.
type Request struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	// Chunked reports whether the body was sent without a Content-Length
	// (streamed).
	Chunked bool
}

// NewServer starts a fake daemon on a loopback TCP port and stops it when
// t ends.
func NewServer(t testing.TB) *Server {
	s := newServer()
	s.srv = httptest.NewServer(s.handler())
	s.Host = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// NewUnixServer starts a fake daemon on the unix socket at path and stops
// it when t ends.
func NewUnixServer(t testing.TB, path string) *Server {
	s := newServer()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("agentboxtest: listening on %s: %v", path, err)
	}
	s.srv = httptest.NewUnstartedServer(s.handler())
	s.srv.Listener = ln
	s.srv.Start()
	s.Host = "unix://" + path
	t.Cleanup(s.srv.Close)
	return s
}

func newServer() *Server {
	now := time.Unix(1700000000, 0).UTC()
	return &Server{
		sandboxes: map[string]*Sandbox{},
		templates: map[string]api.Template{
			"busybox": {Name: "busybox", ID: "sha256:b0", Built: true, Builtin: true, SizeBytes: 2 << 20, CreatedAt: &now},
			"debian":  {Name: "debian", Builtin: true},
		},
	}
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Sandbox returns the fake sandbox id, or nil.
func (s *Server) Sandbox(id string) *Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

// sandboxNamed returns the sandbox named name, or nil: like the daemon,
// the server takes a sandbox's name wherever it takes its id.
func (s *Server) sandboxNamed(name string) *Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.sandboxes {
		if name != "" && sb.Info().Name == name {
			return sb
		}
	}
	return nil
}

// SandboxIDs returns the ids of the existing sandboxes, sorted.
func (s *Server) SandboxIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.sandboxes))
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// AddSandbox creates a sandbox directly, as POST /v1/sandboxes would.
func (s *Server) AddSandbox(req api.CreateSandboxRequest) *Sandbox {
	if req.Template == "" {
		req.Template = "busybox"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	id := fmt.Sprintf("sb-%d", s.nextID)
	sb := &Sandbox{
		info: api.Sandbox{
			ID: id, Template: req.Template, TemplateID: "sha256:" + req.Template, State: api.StateRunning,
			Env: req.Env, Labels: req.Labels, Resources: req.Resources, Hostname: id, Backend: "fake", Name: req.Name,
			CreatedAt: time.Now().UTC().Truncate(time.Second),
		},
		fs:    newMemFS(),
		procs: map[int]*process{},
	}
	if req.Hostname != "" {
		sb.info.Hostname = req.Hostname
	}
	if req.TimeoutSeconds > 0 {
		exp := sb.info.CreatedAt.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		sb.info.ExpiresAt = &exp
	}
	s.sandboxes[id] = sb
	return sb
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		n := len(s.sandboxes)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.Info{Version: "fake-1.0", API: api.Version, Backend: "fake", Capabilities: []string{"exec", "files"}, Sandboxes: n,
			Backends: []api.BackendInfo{{Name: "fake", Default: true, Capabilities: []string{"exec", "files"}}}})
	})
	mux.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		writeJSON(w, http.StatusOK, sb.Info())
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
		s.mu.Lock()
		delete(s.sandboxes, sb.ID())
		s.mu.Unlock()
		sb.killAll()
		w.WriteHeader(http.StatusNoContent)
	}))
	s.execRoutes(mux)
	s.fileRoutes(mux)
	s.templateRoutes(mux)
	return s.middleware(mux)
}

func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqSeq++
		id := "req-" + strconv.Itoa(s.reqSeq)
		s.requests = append(s.requests, Request{
			Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(),
			Chunked: r.ContentLength < 0,
		})
		s.mu.Unlock()
		w.Header().Set(api.VersionHeader, api.Version)
		w.Header().Set(api.RequestIDHeader, id)
		if r.Header.Get(api.VersionHeader) == "" {
			writeError(w, http.StatusBadRequest, "invalid_argument", "missing "+api.VersionHeader+" header")
			return
		}
		if s.APIKey != "" && r.Header.Get("Authorization") != "Bearer "+s.APIKey {
			writeError(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong API key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "decoding body: "+err.Error())
		return
	}
	if req.Runtime != "" && req.Runtime != "fake" {
		writeError(w, http.StatusBadRequest, "invalid_argument", "creating sandbox: runtime \""+req.Runtime+"\": no such backend (this daemon runs fake)")
		return
	}
	if req.Template != "" {
		s.mu.Lock()
		t, ok := s.templates[req.Template]
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "not_found", "template "+req.Template+" not found")
			return
		}
		if !t.Built {
			writeError(w, http.StatusPreconditionFailed, "failed_precondition", "template "+req.Template+" is not built")
			return
		}
	}
	writeJSON(w, http.StatusCreated, s.AddSandbox(req).Info())
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
	s.mu.Lock()
	list := api.SandboxList{Sandboxes: []api.Sandbox{}}
	for _, sb := range s.sandboxes {
		info := sb.Info()
		match := true
		for k, v := range want {
			if info.Labels[k] != v {
				match = false
			}
		}
		if match {
			list.Sandboxes = append(list.Sandboxes, info)
		}
	}
	s.mu.Unlock()
	sort.Slice(list.Sandboxes, func(i, j int) bool { return list.Sandboxes[i].ID < list.Sandboxes[j].ID })
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) withSandbox(h func(http.ResponseWriter, *http.Request, *Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb := s.Sandbox(r.PathValue("id"))
		if sb == nil {
			sb = s.sandboxNamed(r.PathValue("id"))
		}
		if sb == nil {
			writeError(w, http.StatusNotFound, "not_found", "sandbox "+r.PathValue("id")+" not found")
			return
		}
		h(w, r, sb)
	}
}

func (s *Server) templateRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		list := api.TemplateList{Templates: []api.Template{}}
		for _, t := range s.templates {
			list.Templates = append(list.Templates, t)
		}
		s.mu.Unlock()
		sort.Slice(list.Templates, func(i, j int) bool { return list.Templates[i].Name < list.Templates[j].Name })
		writeJSON(w, http.StatusOK, list)
	})
	mux.HandleFunc("GET /v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		t, ok := s.templates[r.PathValue("name")]
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "not_found", "template "+r.PathValue("name")+" not found")
			return
		}
		writeJSON(w, http.StatusOK, t)
	})
	mux.HandleFunc("POST /v1/templates/build", s.buildTemplate)
}

// buildTemplate streams one step event and one log event per step of the
// spec (or a single step for a named template), then done. A step whose Run
// is "fail" ends the build with an error event.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	var req api.BuildTemplateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "decoding body: "+err.Error())
		return
	}
	spec := req.Spec
	if spec == nil {
		s.mu.Lock()
		_, ok := s.templates[req.Name]
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "not_found", "template "+req.Name+" not found")
			return
		}
		spec = &api.TemplateSpec{Name: req.Name, Base: "scratch+busybox", Steps: []api.TemplateStep{{Run: "true"}}}
	}
	if spec.Name == "" {
		writeError(w, http.StatusBadRequest, "invalid_argument", "template spec has no name")
		return
	}
	ew := newEventWriter(w)
	n := len(spec.Steps) + 1
	ew.send(api.BuildEvent{Type: api.BuildEventStep, Step: 1, Steps: n, Message: "base " + spec.Base})
	for i, st := range spec.Steps {
		msg := "RUN " + st.Run
		if st.Copy != nil {
			msg = "COPY " + st.Copy.Src + " " + st.Copy.Dst
		} else if st.Env != nil {
			msg = "ENV"
		}
		ew.send(api.BuildEvent{Type: api.BuildEventStep, Step: i + 2, Steps: n, Message: msg})
		if st.Run == "fail" {
			ew.send(api.BuildEvent{Type: api.BuildEventError, Error: &api.Error{Code: "failed_precondition", Message: "step " + strconv.Itoa(i+2) + " failed", RequestID: w.Header().Get(api.RequestIDHeader)}})
			return
		}
		ew.send(api.BuildEvent{Type: api.BuildEventLog, Message: "output of step " + strconv.Itoa(i+2)})
	}
	now := time.Now().UTC()
	t := api.Template{Name: spec.Name, ID: "sha256:" + spec.Name, Built: true, Env: spec.Env, CreatedAt: &now, SizeBytes: 1234}
	s.mu.Lock()
	s.templates[t.Name] = t
	s.mu.Unlock()
	ew.send(api.BuildEvent{Type: api.BuildEventDone, Template: &t})
}

// eventWriter writes NDJSON events, flushing each.
type eventWriter struct {
	mu sync.Mutex // guards writes to w
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newEventWriter(w http.ResponseWriter) *eventWriter {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &eventWriter{w: w, rc: http.NewResponseController(w)}
}

func (e *eventWriter) send(v any) {
	b, _ := json.Marshal(v)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.rc.Flush()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Code: code, Message: msg, RequestID: w.Header().Get(api.RequestIDHeader)})
}

// errorFor maps a fake filesystem error onto a status and code.
func errorFor(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errNotExist):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, errExist):
		writeError(w, http.StatusConflict, "already_exists", err.Error())
	default:
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	}
}

func cleanPath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	return filepath.Clean(p), nil
}
