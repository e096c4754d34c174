package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// The code interpreter's API (docs/CODE-INTERPRETER.md). A code call is a
// run like any other: each route execs the runner's code client,
//
//	/.agentbox/agentbox guest code-client execute|create|list|delete ID|restart ID
//
// through Service.Exec, the execute pipeline's API trigger (run record,
// metering, wrappers), with the request on its stdin. The client talks to
// the code server inside the sandbox on 127.0.0.1:49999 (starting it on
// first use) and writes its answer to stdout: NDJSON api.CodeEvents, a
// JSON body, or one stream_error event carrying an errdefs code. The
// sandbox is untrusted: every line is decoded and re-encoded, bounded,
// and its messages clipped before they reach the caller.

// CodeClient is the code client's command line inside a sandbox.
var CodeClient = []string{"/.agentbox/agentbox", "guest", "code-client"}

// maxCodeLine bounds one event line from the sandbox (a PNG fits).
const maxCodeLine = 64 << 20

// maxCodeStderr is how much of the client's stderr is kept to explain a
// failure.
const maxCodeStderr = 4 << 10

var codeContextRe = lazyregexp.New(`^[A-Za-z0-9_-]{1,64}$`)

func (h *handler) codeRoutes() []route {
	return []route{
		{"POST", "/v1/sandboxes/{id}/code", h.runCode},
		{"GET", "/v1/sandboxes/{id}/code/contexts", h.listCodeContexts},
		{"POST", "/v1/sandboxes/{id}/code/contexts", h.createCodeContext},
		{"DELETE", "/v1/sandboxes/{id}/code/contexts/{ctx}", h.codeContextOp("delete")},
		{"POST", "/v1/sandboxes/{id}/code/contexts/{ctx}/restart", h.codeContextOp("restart")},
	}
}

func validCodeRequest(req *api.CodeRequest) error {
	if req.Language != "" && req.Context != "" {
		return errorf("give a context or a language, not both")
	}
	if req.Context != "" && !codeContextRe.MatchString(req.Context) {
		return errorf("invalid context id %q", clip(req.Context))
	}
	if _, ok := api.CodeLanguage(req.Language); !ok {
		return errorf("language %q not supported (python, javascript, bash)", clip(req.Language))
	}
	if req.TimeoutSeconds < 0 || req.TimeoutSeconds > 86400 {
		return errorf("timeout_seconds must be between 0 and 86400")
	}
	if !utf8.ValidString(req.Code) {
		return errorf("code is not UTF-8")
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errorf("invalid env name %q", clip(k))
		}
	}
	return nil
}

// codeExec runs the code client with args and stdin through the pipeline.
func (h *handler) codeExec(ctx context.Context, id string, stdin []byte, args ...string) (execstream.Stream, error) {
	cmd := append(append([]string{}, CodeClient...), args...)
	return h.svc.Exec(ctx, id, api.ExecRequest{Cmd: cmd, Stdin: stdin})
}

// runCode streams a cell's events.
func (h *handler) runCode(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.CodeRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validCodeRequest(&req); err != nil {
		return err
	}
	timeout := req.TimeoutSeconds
	if timeout == 0 {
		timeout = 300
	}
	body, err := json.Marshal(struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id,omitempty"`
		Language  string            `json:"language,omitempty"`
		EnvVars   map[string]string `json:"env_vars,omitempty"`
		Timeout   float64           `json:"timeout"`
	}{req.Code, req.Context, req.Language, req.Env, timeout})
	if err != nil {
		return err
	}
	stream, err := h.codeExec(r.Context(), id, body, "execute")
	if err != nil {
		return err
	}
	rs := stateFrom(r.Context())
	defer closeWhenDone(r, stream)()
	out := newNDJSON(w)
	fail := func(err error) error {
		if !out.started {
			return err
		}
		_, pub := publicError(err, rs.id)
		rs.err = err
		_ = out.write(api.CodeEvent{Type: api.CodeEventStreamError, Error: &pub})
		return nil
	}
	cs := codeStream{stream: stream}
	for {
		ev, err := cs.next()
		if err != nil {
			if r.Context().Err() != nil {
				rs.err = fmt.Errorf("client went away: %w", r.Context().Err())
				return nil
			}
			return fail(err)
		}
		if ev.Type == api.CodeEventStreamError {
			return fail(codeError(ev.Error))
		}
		if err := out.write(ev); err != nil {
			rs.err = fmt.Errorf("writing stream: %w", err)
			return nil
		}
		if ev.Final() {
			return nil
		}
	}
}

// codeError is the error a stream_error event from the sandbox reports:
// its category, and its message clipped.
func codeError(e *api.Error) error {
	if e == nil {
		return fmt.Errorf("code client failed: %w", errdefs.ErrInternal)
	}
	cat := errdefs.FromCode(e.Code)
	msg := strings.TrimSuffix(e.Message, ": "+cat.Error())
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	msg = strings.ToValidUTF8(msg, "?")
	return fmt.Errorf("code interpreter: %s: %w", msg, cat)
}

// codeStream turns the client's exec stream into code events: stdout
// lines decoded (a line may span many stdout events), stderr kept to
// explain a failure, the exit checked.
type codeStream struct {
	stream execstream.Stream
	buf    []byte
	stderr []byte
	exited bool
}

func (c *codeStream) next() (api.CodeEvent, error) {
	for {
		if i := bytes.IndexByte(c.buf, '\n'); i >= 0 {
			line := c.buf[:i]
			c.buf = c.buf[i+1:]
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			var ev api.CodeEvent
			if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
				return api.CodeEvent{}, fmt.Errorf("code client sent a malformed line: %w", errdefs.ErrInternal)
			}
			return ev, nil
		}
		if len(c.buf) > maxCodeLine {
			return api.CodeEvent{}, fmt.Errorf("code client sent a line over %d bytes: %w", maxCodeLine, errdefs.ErrInternal)
		}
		if c.exited {
			return api.CodeEvent{}, c.exitError()
		}
		ev, err := c.stream.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.exited = true
				continue
			}
			return api.CodeEvent{}, err
		}
		switch ev.Type {
		case api.EventStdout:
			c.buf = append(c.buf, ev.Data...)
		case api.EventStderr:
			if n := maxCodeStderr - len(c.stderr); n > 0 {
				c.stderr = append(c.stderr, ev.Data[:min(n, len(ev.Data))]...)
			}
		case api.EventExit:
			c.exited = true
			if ev.ExitCode != nil && *ev.ExitCode == 127 {
				return api.CodeEvent{}, fmt.Errorf("this sandbox's runner has no code interpreter (upgrade it): %w", errdefs.ErrFailedPrecondition)
			}
		case api.EventError:
			if ev.Error != nil {
				return api.CodeEvent{}, fmt.Errorf("%s: %w", ev.Error.Message, errdefs.FromCode(ev.Error.Code))
			}
			return api.CodeEvent{}, fmt.Errorf("exec failed: %w", errdefs.ErrInternal)
		}
	}
}

// exitError explains a client that ended without a final event.
func (c *codeStream) exitError() error {
	msg := strings.TrimSpace(strings.ToValidUTF8(string(c.stderr), "?"))
	if msg == "" {
		msg = "no output"
	}
	return fmt.Errorf("code client ended early: %s: %w", clip(msg), errdefs.ErrUnavailable)
}

// codeCall runs a non-streaming client operation and decodes its JSON
// answer into v (nil: none expected).
func (h *handler) codeCall(r *http.Request, id string, stdin []byte, v any, args ...string) error {
	stream, err := h.codeExec(r.Context(), id, stdin, args...)
	if err != nil {
		return err
	}
	defer stream.Close()
	cs := codeStream{stream: stream}
	var body []byte
	for {
		ev, err := cs.stream.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
		if ev.Type == api.EventStdout {
			if len(body)+len(ev.Data) > 1<<20 {
				return fmt.Errorf("the sandbox's code client answered more than 1 MiB: %w", errdefs.ErrFailedPrecondition)
			}
			body = append(body, ev.Data...)
		}
		if ev.Type == api.EventStderr && len(cs.stderr) < maxCodeStderr {
			cs.stderr = append(cs.stderr, ev.Data[:min(maxCodeStderr-len(cs.stderr), len(ev.Data))]...)
		}
		if ev.Type == api.EventError {
			if ev.Error != nil {
				return fmt.Errorf("%s: %w", ev.Error.Message, errdefs.FromCode(ev.Error.Code))
			}
			return fmt.Errorf("exec failed: %w", errdefs.ErrInternal)
		}
		if ev.Type == api.EventExit {
			if ev.ExitCode != nil && *ev.ExitCode == 127 {
				return fmt.Errorf("this sandbox's runner has no code interpreter (upgrade it): %w", errdefs.ErrFailedPrecondition)
			}
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				var se api.CodeEvent
				if json.Unmarshal(bytes.TrimSpace(body), &se) == nil && se.Type == api.CodeEventStreamError {
					return codeError(se.Error)
				}
				return cs.exitError()
			}
			break
		}
	}
	if v == nil {
		return nil
	}
	// The code client runs inside the sandbox, whose code is hostile by
	// default: what it answers is the sandbox's doing, not the daemon's
	// (a client error, never a 500 logged as the daemon's fault).
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("the sandbox's code client sent a malformed answer: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (h *handler) listCodeContexts(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var l api.CodeContextList
	if err := h.codeCall(r, id, nil, &l, "list"); err != nil {
		return err
	}
	if l.Contexts == nil {
		l.Contexts = []api.CodeContext{}
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (h *handler) createCodeContext(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.CreateCodeContextRequest
	if err := h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := validCodeRequest(&api.CodeRequest{Language: req.Language}); err != nil {
		return err
	}
	if req.Cwd != "" && (!strings.HasPrefix(req.Cwd, "/") || strings.ContainsRune(req.Cwd, 0)) {
		return errorf("cwd must be an absolute path")
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var c api.CodeContext
	if err := h.codeCall(r, id, body, &c, "create"); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, c)
	return nil
}

func (h *handler) codeContextOp(op string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := sandboxID(r)
		if err != nil {
			return err
		}
		ctxID := r.PathValue("ctx")
		if !codeContextRe.MatchString(ctxID) {
			return errorf("invalid context id %q", clip(ctxID))
		}
		if err := h.codeCall(r, id, nil, nil, op, ctxID); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}
