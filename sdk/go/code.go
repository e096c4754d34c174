package agentbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentbox/agentbox/api"
)

// Execution is the outcome of a cell run by RunCode: what it wrote, its
// results (display data such as figures, and the value of its last
// expression, IsMainResult), and the error it raised, if any.
type Execution struct {
	Stdout         string
	Stderr         string
	Results        []api.CodeEvent // type "result"
	Error          *api.CodeEvent  // type "error": Name, Value, Traceback
	ExecutionCount int
}

// Text returns the text of the main result (the last expression's value),
// or "".
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeOptions are the options of RunCode. OnEvent, when set, is called
// with every event as it arrives (stdout while the cell still runs).
type CodeOptions struct {
	Language string            // python (default), javascript, bash; not with Context
	Context  string            // a context id from CreateCodeContext
	Env      map[string]string // this cell's environment
	Timeout  float64           // seconds; 0: the daemon's default (300)
	OnEvent  func(api.CodeEvent)
}

// RunCode runs a cell of code in the sandbox's code interpreter
// (docs/CODE-INTERPRETER.md): in the context named, or the default context
// of the language, whose state persists from cell to cell. An error the
// code raised is in Execution.Error, not the returned error, which is
// non-nil only when the cell could not be run to its end.
func (s *Sandbox) RunCode(ctx context.Context, code string, opts CodeOptions) (*Execution, error) {
	req := api.CodeRequest{Code: code, Language: opts.Language, Context: opts.Context, Env: opts.Env, TimeoutSeconds: opts.Timeout}
	resp, err := s.c.send(ctx, request{method: http.MethodPost, path: s.path("/code"), json: req})
	if err != nil {
		return nil, wrapf(err, "running code in sandbox %s", s.id)
	}
	defer resp.Body.Close()
	var (
		ex             Execution
		stdout, stderr strings.Builder
	)
	dec := newNDJSON(resp.Body)
	for {
		var ev api.CodeEvent
		if err := dec.next(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return &ex, wrapf(truncated("reading code events", err), "running code in sandbox %s", s.id)
		}
		if opts.OnEvent != nil {
			opts.OnEvent(ev)
		}
		switch ev.Type {
		case api.CodeEventStdout:
			stdout.WriteString(ev.Text)
		case api.CodeEventStderr:
			stderr.WriteString(ev.Text)
		case api.CodeEventResult:
			ex.Results = append(ex.Results, ev)
		case api.CodeEventError:
			e := ev
			ex.Error = &e
		case api.CodeEventNumberOfExecutions:
			ex.ExecutionCount = ev.ExecutionCount
		case api.CodeEventStreamError:
			ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
			return &ex, wrapf(streamError(ev.Error), "running code in sandbox %s", s.id)
		}
		if ev.Final() {
			ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
			return &ex, nil
		}
	}
}

// CreateCodeContext makes a code context of language ("" is Python) with
// working directory cwd ("" is the code server's).
func (s *Sandbox) CreateCodeContext(ctx context.Context, language, cwd string) (api.CodeContext, error) {
	var c api.CodeContext
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/code/contexts"), json: api.CreateCodeContextRequest{Language: language, Cwd: cwd}}, &c); err != nil {
		return c, wrapf(err, "creating a code context in sandbox %s", s.id)
	}
	return c, nil
}

// CodeContexts lists the sandbox's code contexts.
func (s *Sandbox) CodeContexts(ctx context.Context) ([]api.CodeContext, error) {
	var l api.CodeContextList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/code/contexts")}, &l); err != nil {
		return nil, wrapf(err, "listing code contexts of sandbox %s", s.id)
	}
	return l.Contexts, nil
}

// DeleteCodeContext ends a code context.
func (s *Sandbox) DeleteCodeContext(ctx context.Context, id string) error {
	if err := s.c.call(ctx, request{method: http.MethodDelete, path: s.path("/code/contexts/" + url.PathEscape(id))}, nil); err != nil {
		return wrapf(err, "deleting code context %s of sandbox %s", id, s.id)
	}
	return nil
}

// RestartCodeContext restarts a code context: its state is lost.
func (s *Sandbox) RestartCodeContext(ctx context.Context, id string) error {
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/code/contexts/" + url.PathEscape(id) + "/restart")}, nil); err != nil {
		return wrapf(err, "restarting code context %s of sandbox %s", id, s.id)
	}
	return nil
}
