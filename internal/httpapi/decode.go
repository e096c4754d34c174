package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/strictjson"
	"github.com/agentbox/agentbox/internal/validate"
)

// Limits on client input.
const (
	maxPathBytes = 4096
	maxPid       = 1 << 22 // Linux PID_MAX_LIMIT
	// bodyReadTimeout bounds the reading of a JSON body (a client
	// trickling one byte a second holds its connection no longer).
	// Streamed bodies (uploads, stdin) have no such bound.
	bodyReadTimeout = 30 * time.Second
)

var (
	sandboxIDRe    = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,63}$`)
	exposureIDRe   = lazyregexp.New(`^[a-z0-9]{16}$`)
	templateNameRe = lazyregexp.New(`^([a-z0-9][a-z0-9-]{0,31}~)?[A-Za-z0-9][A-Za-z0-9._-]{0,127}(@[A-Za-z0-9]{1,64})?$`) // [TENANT~]NAME[@VERSION]; only the admin may name another tenant's
)

// decodeJSON reads exactly one JSON value into v from a body of at most
// MaxBodyBytes within bodyReadTimeout. Unknown fields, duplicate keys (at
// any depth, also keys that differ only in case but name one field:
// internal/strictjson), trailing data and (unless optional) an empty body
// are invalid arguments; an oversized body is too large.
func (h *handler) decodeJSON(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	// The deadline is lifted again once the body is read: a read that
	// fails after it (net/http's background read while the handler runs)
	// would cancel the request, and exec streams its output for as long as
	// the command lasts. Writers without deadlines (tests) are left alone.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(bodyReadTimeout)) == nil
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		return jsonError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			if optional {
				return nil
			}
			return errorf("request body is required")
		}
		return jsonError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errorf("unexpected data after the JSON body")
	}
	if err := strictjson.CheckDuplicates(data, reflect.TypeOf(v)); err != nil {
		var dup *strictjson.DuplicateKeyError
		if errors.As(err, &dup) {
			return errorf("request body: %s", clipError(dup))
		}
		return errorf("malformed JSON body")
	}
	return nil
}

// clipError is dup's message with the key and path clipped.
func clipError(dup *strictjson.DuplicateKeyError) string {
	return (&strictjson.DuplicateKeyError{Path: clip(dup.Path), Key: clip(dup.Key)}).Error()
}

// jsonError turns a decoding error into a client error that names the
// problem but echoes no input beyond field names.
func jsonError(err error) error {
	var (
		mbe *http.MaxBytesError
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return fmt.Errorf("request body larger than %d bytes: %w", mbe.Limit, err)
	case errors.As(err, &syn):
		return errorf("malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return errorf("field %q: expected %s", typ.Field, typ.Type)
		}
		return errorf("request body: expected a JSON %s", typ.Type)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf("malformed JSON: unexpected end of body")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return errorf("malformed JSON body")
	}
}

// sandboxID returns the sandbox id of the validated {id} path value, an
// id or a name (Service.ResolveSandbox). Every route naming a sandbox
// comes through here: this is the one place names are resolved.
func sandboxID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !sandboxIDRe.MatchString(id) {
		return "", errorf("invalid sandbox id or name %q: want ^[a-z0-9][a-z0-9-]{0,63}$", clip(id))
	}
	return resolveSandbox(r, id), nil
}

// resolveSandbox returns the id of the sandbox ref (an id or a name,
// already validated) designates for r's caller (Service.ResolveSandbox).
func resolveSandbox(r *http.Request, ref string) string {
	if resolve := stateFrom(r.Context()).resolve; resolve != nil {
		return resolve(r.Context(), ref)
	}
	return ref
}

// pidParam returns the validated {pid} path value.
func pidParam(r *http.Request) (int, error) {
	s := r.PathValue("pid")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 || pid > maxPid {
		return 0, errorf("invalid pid %q: want a positive integer", clip(s))
	}
	return pid, nil
}

// validPath checks a sandbox file path from a query or a body.
func validPath(name, p string) error {
	switch {
	case p == "":
		return errorf("%s is required", name)
	case len(p) > maxPathBytes:
		return errorf("%s is longer than %d bytes", name, maxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return errorf("%s contains a NUL byte", name)
	case !strings.HasPrefix(p, "/"):
		return errorf("%s %q must be absolute", name, clip(p))
	}
	return nil
}

// pathQuery returns the validated ?path= parameter.
func pathQuery(r *http.Request) (string, error) {
	q := r.URL.Query()
	if len(q["path"]) > 1 {
		return "", errorf("path given more than once")
	}
	p := q.Get("path")
	return p, validPath("path", p)
}

// boolQuery parses an optional boolean query parameter (default false).
func boolQuery(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, errorf("%s=%q: want true or false", name, clip(s))
	}
	return b, nil
}

// modeQuery parses ?mode= as octal permission bits, default 0644.
func modeQuery(r *http.Request) (uint32, error) {
	s := r.URL.Query().Get("mode")
	if s == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errorf("mode=%q: want octal permission bits such as 0644", clip(s))
	}
	return uint32(m), nil
}

// labelsQuery parses repeated ?label=k=v filters.
func labelsQuery(r *http.Request) (map[string]string, error) {
	vals := r.URL.Query()["label"]
	if len(vals) == 0 {
		return nil, nil
	}
	labels := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || len(kv) > 1024 || strings.IndexByte(kv, 0) >= 0 {
			return nil, errorf("label filter %q: want key=value", clip(kv))
		}
		labels[k] = v
	}
	return labels, nil
}

// noNUL rejects NUL bytes in strings that end up in argv or environ.
func noNUL(what string, ss ...string) error {
	for _, s := range ss {
		if strings.IndexByte(s, 0) >= 0 {
			return errorf("%s contains a NUL byte", what)
		}
	}
	return nil
}

// validEnv checks an environment a request sets by the rule of
// validate.Env, naming the field what in the error.
func validEnv(what string, env map[string]string) error {
	if err := validate.Env(env); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// validExec checks the shape of an exec request.
func validExec(req *api.ExecRequest) error {
	if (len(req.Cmd) == 0) == (req.Command == "") {
		return errorf("exactly one of cmd or command must be set")
	}
	if err := noNUL("cmd", req.Cmd...); err != nil {
		return err
	}
	if err := noNUL("command", req.Command, req.User); err != nil {
		return err
	}
	if err := validEnv("env", req.Env); err != nil {
		return err
	}
	if req.Cwd != "" {
		if err := validPath("cwd", req.Cwd); err != nil {
			return err
		}
	}
	if req.TimeoutSeconds < 0 {
		return errorf("timeout_seconds must not be negative")
	}
	if req.TTY != nil {
		if err := validTTY(*req.TTY); err != nil {
			return err
		}
	}
	return nil
}

func validTTY(t api.TTY) error {
	if t.Rows == 0 || t.Cols == 0 {
		return errorf("tty rows and cols must be positive")
	}
	return nil
}

// clip shortens echoed input in error messages.
func clip(s string) string {
	const max = 80
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
