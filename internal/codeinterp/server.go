// Package codeinterp is the code interpreter that runs inside a sandbox
// (docs/CODE-INTERPRETER.md): an HTTP server speaking E2B's
// code-interpreter protocol (on 127.0.0.1:49999 by default), which keeps
// stateful execution contexts, each one interpreter process driven by a
// small embedded driver (Python, JavaScript with node, bash).
//
// It is platform code living in the runner (the agentbox binary mounted
// read-only at /.agentbox), not in the template: `agentbox guest
// code-server` runs it, started on demand by `agentbox guest code-client`,
// which is what the daemon's POST /v1/sandboxes/{id}/code runs through the
// execute pipeline.
//
// The protocol (E2B's, which @e2b/code-interpreter speaks):
//
//	GET    /health                 200 "OK"
//	POST   /execute                {code, context_id, language, env_vars, timeout} → NDJSON api.CodeEvent lines
//	POST   /contexts               {language, cwd} → api.CodeContext
//	GET    /contexts               → [api.CodeContext]
//	DELETE /contexts/{id}          204
//	POST   /contexts/{id}/restart  204
//
// Errors are a JSON {"error": message} with 400, 404 or 500 (E2B's SDK
// shows the body of any non-2xx). Inside a driver, see kernel.go and
// drivers/: requests on fd 3, events on fd 4, the cell's output on fds 1
// and 2 cut at a per-process marker.
//
// The server trusts its callers: it runs as a sandbox user, reachable from
// inside the sandbox only, where any process could run code anyway.
package codeinterp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// DefaultAddr is where the server listens: E2B's code-interpreter port.
const DefaultAddr = "127.0.0.1:49999"

// maxBody bounds a request body (a cell of code).
const maxBody = 16 << 20

// Server holds the contexts. Its methods are safe for concurrent use;
// cells of one context run one after another.
type Server struct {
	launch Launcher
	cwd    string
	env    []string
	log    *slog.Logger

	// mu guards the fields below.
	mu       sync.Mutex
	contexts map[string]*kernel
	defaults map[string]string // language → id of its default context
}

// Config configures a Server; zero values take defaults.
type Config struct {
	Launch Launcher     // default DefaultLauncher
	Cwd    string       // contexts' default working directory; default the process's
	Env    []string     // drivers' environment; default os.Environ()
	Logger *slog.Logger // default discard
}

// New returns a Server with no context; the default context of a
// language is made on its first use.
func New(cfg Config) *Server {
	s := &Server{launch: cfg.Launch, cwd: cfg.Cwd, env: cfg.Env, log: cfg.Logger, contexts: map[string]*kernel{}, defaults: map[string]string{}}
	if s.launch == nil {
		s.launch = DefaultLauncher
	}
	if s.cwd == "" {
		s.cwd, _ = os.Getwd()
	}
	if s.env == nil {
		s.env = os.Environ()
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return s
}

// Close ends every context.
func (s *Server) Close() {
	s.mu.Lock()
	ks := s.contexts
	s.contexts, s.defaults = map[string]*kernel{}, map[string]string{}
	s.mu.Unlock()
	for _, k := range ks {
		k.close()
	}
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// CreateContext makes a context (its process starts with its first cell).
func (s *Server) CreateContext(language, cwd string) (api.CodeContext, error) {
	lang, err := Language(language)
	if err != nil {
		return api.CodeContext{}, err
	}
	if cwd == "" {
		cwd = s.cwd
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return api.CodeContext{}, fmt.Errorf("cwd %q is not a directory: %w", cwd, errdefs.ErrInvalidArgument)
	}
	k := &kernel{ctx: api.CodeContext{ID: newID(), Language: lang, Cwd: cwd}, launch: s.launch, env: s.env}
	s.mu.Lock()
	s.contexts[k.ctx.ID] = k
	s.mu.Unlock()
	return k.ctx, nil
}

// Contexts lists the contexts, sorted by id.
func (s *Server) Contexts() []api.CodeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]api.CodeContext, 0, len(s.contexts))
	for _, k := range s.contexts {
		out = append(out, k.ctx)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *Server) lookup(id string) (*kernel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.contexts[id]
	if !ok {
		return nil, fmt.Errorf("context %q: %w", id, errdefs.ErrNotFound)
	}
	return k, nil
}

// DeleteContext ends a context and forgets it.
func (s *Server) DeleteContext(id string) error {
	s.mu.Lock()
	k, ok := s.contexts[id]
	delete(s.contexts, id)
	for l, d := range s.defaults {
		if d == id {
			delete(s.defaults, l)
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("context %q: %w", id, errdefs.ErrNotFound)
	}
	k.close()
	return nil
}

// RestartContext restarts a context's process: its state is lost.
func (s *Server) RestartContext(id string) error {
	k, err := s.lookup(id)
	if err != nil {
		return err
	}
	return k.restart()
}

// context returns the context a request names: id, or the default
// context of language.
func (s *Server) context(id, language string) (*kernel, error) {
	if id != "" && language != "" {
		return nil, fmt.Errorf("give a context or a language, not both: %w", errdefs.ErrInvalidArgument)
	}
	if id != "" {
		return s.lookup(id)
	}
	lang, err := Language(language)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if d, ok := s.defaults[lang]; ok {
		if k, ok := s.contexts[d]; ok {
			s.mu.Unlock()
			return k, nil
		}
	}
	k := &kernel{ctx: api.CodeContext{ID: newID(), Language: lang, Cwd: s.cwd}, launch: s.launch, env: s.env}
	s.contexts[k.ctx.ID] = k
	s.defaults[lang] = k.ctx.ID
	s.mu.Unlock()
	return k, nil
}

// ExecuteRequest is the body of POST /execute: E2B's fields, and Timeout
// (seconds), agentbox's.
type ExecuteRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	Timeout   float64           `json:"timeout,omitempty"`
}

// Execute runs a cell, calling emit for each event (see kernel.execute).
func (s *Server) Execute(ctx context.Context, req ExecuteRequest, emit func(api.CodeEvent) error) error {
	k, err := s.context(req.ContextID, req.Language)
	if err != nil {
		return err
	}
	if req.Timeout < 0 {
		return fmt.Errorf("negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	return k.execute(ctx, req.Code, req.EnvVars, time.Duration(req.Timeout*float64(time.Second)), emit)
}

// Handler serves the protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "OK") })
	mux.HandleFunc("POST /execute", s.serveExecute)
	mux.HandleFunc("POST /contexts", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateCodeContextRequest
		if err := decode(r, &req); err != nil {
			writeError(w, err)
			return
		}
		c, err := s.CreateContext(req.Language, req.Cwd)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	mux.HandleFunc("GET /contexts", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Contexts()) })
	mux.HandleFunc("DELETE /contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.DeleteContext(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /contexts/{id}/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.RestartContext(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func (s *Server) serveExecute(w http.ResponseWriter, r *http.Request) {
	var req ExecuteRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	err := s.Execute(r.Context(), req, func(ev api.CodeEvent) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil {
		if !started {
			writeError(w, err)
			return
		}
		s.log.Warn("cell failed after its stream began", "err", err)
	}
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decoding the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers err with its category's status and E2B's error body
// (with agentbox's code, errdefs.Code, beside it).
func writeError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch errdefs.Code(err) {
	case "invalid_argument":
		status = http.StatusBadRequest
	case "not_found":
		status = http.StatusNotFound
	case "failed_precondition":
		status = http.StatusPreconditionFailed
	case "unavailable":
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]string{"error": err.Error(), "code": errdefs.Code(err)})
}
