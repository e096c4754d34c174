// Package outputschema validates a command's stdout against a JSON Schema
// at the exec boundary (ExecRequest.OutputSchema): the caller gets either
// output that conforms or a typed error, never the raw text of output that
// does not. It is what keeps a sandbox's free text (and whatever a prompt
// injection put into it) out of an agent's context when the agent asked
// for structured data.
//
// The schema is compiled when the exec is requested (a bad schema fails the
// request before anything runs) with every external reference refused: a
// $ref to a file or URL is an invalid schema, so a caller cannot make the
// daemon read a host file or fetch a URL. Only the JSON Schema metaschemas
// (embedded in the library) resolve.
//
// The stream wrapper withholds stdout until the command's exit, up to
// MaxOutput bytes, then validates it as one JSON document: when it
// conforms, it passes on and then the exit (with its status, whatever it
// is); when it does not (or is not JSON, or is too large, or the command
// ended in an error), one error event replaces it. Stderr is never
// delivered: it is free text the schema does not cover (the flight
// record keeps its redacted excerpt, as for any run). The error
// names the failing instance and keyword locations and never quotes the
// output (the library's messages do: "'x' does not match pattern"), so no
// byte of non-conforming output reaches the caller. The run's own record
// (the flight recorder, the run record) sees the output as it was: the
// wrapper sits outside them.
package outputschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// Bounds.
const (
	// MaxSchema bounds a schema document.
	MaxSchema = 64 << 10
	// MaxOutput bounds the stdout validated; a command printing more gets
	// a ReasonOutputTooLarge error.
	MaxOutput = 4 << 20
	// maxProblems bounds the locations an error names.
	maxProblems = 5
)

// Reasons of the errors (api.Error.Reason), stable for clients.
const (
	// ReasonMismatch: stdout is not JSON or does not conform (category
	// failed_precondition).
	ReasonMismatch = "output_schema_mismatch"
	// ReasonTooLarge: stdout is larger than MaxOutput (category too_large).
	ReasonTooLarge = "output_too_large"
)

// Schema is a compiled output schema. Safe for concurrent use.
type Schema struct {
	s *jsonschema.Schema
}

// refuseLoader refuses every external resource.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external references are not allowed (%s)", clip(url))
}

// schemaURL names the caller's schema: a hierarchical URL of a reserved
// domain, so a relative $ref resolves below it (and is refused).
const schemaURL = "https://agentbox.invalid/output-schema.json"

// Compile compiles raw, a JSON Schema document (draft 2020-12 unless its
// $schema says otherwise). Errors are ErrInvalidArgument or ErrTooLarge.
func Compile(raw []byte) (*Schema, error) {
	if len(raw) > MaxSchema {
		return nil, fmt.Errorf("output_schema is larger than %d bytes: %w", MaxSchema, errdefs.ErrTooLarge)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("output_schema is not JSON: %w", errdefs.ErrInvalidArgument)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("output_schema: %s: %w", clip(err.Error()), errdefs.ErrInvalidArgument)
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("output_schema is not a valid schema: %s: %w", clip(err.Error()), errdefs.ErrInvalidArgument)
	}
	return &Schema{s: s}, nil
}

// Validate checks out against the schema. The error is typed (its
// errdefs category and reason) and quotes nothing of out.
func (s *Schema) Validate(out []byte) error {
	if len(out) > MaxOutput {
		return tooLarge()
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return mismatch("stdout is not a JSON document")
	}
	if _, err := dec.Token(); err == nil {
		return mismatch("stdout holds more than one JSON document")
	}
	err := s.s.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return mismatch("stdout does not conform to the output schema")
	}
	var where []string
	collect(ve, &where)
	msg := "stdout does not conform to the output schema"
	if len(where) > 0 {
		msg += ": " + strings.Join(where, "; ")
	}
	return mismatch(msg)
}

// Error is the typed error of output that fails validation: its category
// (errors.Is with errdefs.ErrFailedPrecondition or ErrTooLarge) and
// reason (ReasonMismatch, ReasonTooLarge) are what a client acts on; its
// text names locations only.
type Error struct {
	Msg      string
	Reason   string
	Category error
}

func (e *Error) Error() string       { return e.Msg }
func (e *Error) Unwrap() error       { return e.Category }
func (e *Error) ErrorReason() string { return e.Reason }

func mismatch(msg string) error {
	if !strings.Contains(msg, "output schema") {
		msg = "output schema: " + msg
	}
	return &Error{Msg: msg, Reason: ReasonMismatch, Category: errdefs.ErrFailedPrecondition}
}

func tooLarge() error {
	return &Error{Msg: fmt.Sprintf("stdout is larger than the %d bytes validated against the output schema", MaxOutput), Reason: ReasonTooLarge, Category: errdefs.ErrTooLarge}
}

// collect names the leaves of e (the failing keywords) by their instance
// location and keyword path: locations come from the output and the
// schema, but a location of the output is a path of object keys, which
// the output chose; they are clipped and quoted as JSON pointers.
func collect(e *jsonschema.ValidationError, out *[]string) {
	if len(*out) >= maxProblems {
		return
	}
	if len(e.Causes) == 0 {
		kw := ""
		if e.ErrorKind != nil {
			kw = strings.Join(e.ErrorKind.KeywordPath(), "/")
		}
		*out = append(*out, fmt.Sprintf("at %s: keyword %s", clip(pointer(e.InstanceLocation)), clip(kw)))
		return
	}
	for _, c := range e.Causes {
		collect(c, out)
	}
}

func pointer(loc []string) string {
	if len(loc) == 0 {
		return `""`
	}
	var b strings.Builder
	for _, p := range loc {
		p = strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1")
		b.WriteString("/" + p)
	}
	q, _ := json.Marshal(b.String())
	return string(q)
}

func clip(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// Wrap returns s with its stdout validated against sch as the package doc
// says. Closing the returned stream closes s.
func Wrap(s execstream.Stream, sch *Schema) execstream.Stream {
	return &stream{inner: s, sch: sch}
}

type stream struct {
	inner execstream.Stream
	sch   *Schema

	held   []api.ExecEvent
	stdout bytes.Buffer
	tooBig bool
	out    []api.ExecEvent // ready to deliver, after the final event came
	done   bool
}

func (t *stream) Next() (api.ExecEvent, error) {
	for {
		if len(t.out) > 0 {
			ev := t.out[0]
			t.out = t.out[1:]
			return ev, nil
		}
		if t.done {
			return api.ExecEvent{}, io.EOF
		}
		ev, err := t.inner.Next()
		if err != nil {
			return ev, err
		}
		switch ev.Type {
		case api.EventStdout:
			if t.tooBig || t.stdout.Len()+len(ev.Data) > MaxOutput {
				t.tooBig = true
				t.held = nil
				t.stdout.Reset()
				continue
			}
			t.stdout.Write(ev.Data)
			t.held = append(t.held, ev)
		case api.EventStderr:
			continue // never delivered (package doc)
		case api.EventExit:
			t.done = true
			var err error
			if t.tooBig {
				err = tooLarge()
			} else {
				err = t.sch.Validate(t.stdout.Bytes())
			}
			if err != nil {
				t.held = nil
				t.out = []api.ExecEvent{errorEvent(err, ev)}
				continue
			}
			t.out = append(t.held, ev)
			t.held = nil
		case api.EventError:
			// The command's own failure: what it printed is not delivered
			// (it was not validated), the error is.
			t.done = true
			t.held = nil
			t.out = []api.ExecEvent{ev}
		default:
			return ev, nil
		}
	}
}

// errorEvent is the error event replacing output that failed validation;
// it says how the command ended, never what it printed.
func errorEvent(err error, exit api.ExecEvent) api.ExecEvent {
	msg := err.Error()
	var oe *Error
	if !errors.As(err, &oe) {
		msg = "stdout does not conform to the output schema"
	}
	switch {
	case exit.Signal != "":
		msg += fmt.Sprintf(" (the command was killed by SIG%s)", exit.Signal)
	case exit.ExitCode != nil:
		msg += fmt.Sprintf(" (the command exited with status %d)", *exit.ExitCode)
	}
	return api.ExecEvent{Type: api.EventError, Error: &api.Error{Code: errdefs.Code(err), Message: msg, Reason: errdefs.Reason(err)}}
}

func (t *stream) Close() error { return t.inner.Close() }
