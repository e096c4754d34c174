package agentbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Error codes sent by the daemon in APIError.Code.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeConflict           = "conflict"
	CodeFailedPrecondition = "failed_precondition"
	CodeTooLarge           = "too_large"
	CodeResourceExhausted  = "resource_exhausted"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeUnavailable        = "unavailable"
	CodeNotImplemented     = "not_implemented"
	CodeInternal           = "internal"
)

// Reasons of APIError.Reason.
const (
	// ReasonCommandNotFound: the executable of an exec does not exist
	// (Code not_found). The CLI exits 127, as shells do.
	ReasonCommandNotFound = "command_not_found"
	// ReasonCommandNotExecutable: it exists but cannot be executed (Code
	// permission_denied). The CLI exits 126.
	ReasonCommandNotExecutable = "command_not_executable"
)

// APIError is an error reported by the daemon: a non-2xx response, or an
// error event at the end of an exec, attach or build stream (Status 0).
type APIError struct {
	Status    int    // HTTP status; 0 for an error event inside a stream
	Code      string // stable category, one of the Code* constants
	Message   string // human-readable, safe to show
	RequestID string // matches the daemon's log line
	// Reason refines Code where it matters to a caller: ReasonCommandNotFound,
	// ReasonCommandNotExecutable; "" for most errors.
	Reason string

	body       []byte        // the response body (bounded), for calls whose errors carry more
	retryAfter time.Duration // from the Retry-After header of a 429 or 503
}

// RetryAfter returns how long the daemon asked the caller to wait before
// retrying (the Retry-After header of a 429 or 503 response, e.g. a tenant
// over its quota), or 0 when it did not say.
func (e *APIError) RetryAfter() time.Duration { return e.retryAfter }

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ReplaceAll(e.Code, "_", " ")
	}
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return msg
}

// ErrStreamTruncated is wrapped by the error returned when an exec, attach or
// build stream ends before its final event: the connection was lost, and the
// command may still be running.
var ErrStreamTruncated = errors.New("stream ended before its final event (connection lost)")

// ConnectionError is a failure to reach the daemon or to read its answer.
type ConnectionError struct {
	Host string // the daemon address
	Op   string // e.g. "GET /sandboxes"
	Err  error
}

func (e *ConnectionError) Error() string {
	return fmt.Sprintf("daemon at %s: %s: %v", e.Host, e.Op, e.Err)
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// IsUnreachable reports whether err means no daemon is listening at the
// configured address (connection refused, or the unix socket is missing), as
// opposed to a daemon that answered with an error.
func IsUnreachable(err error) bool {
	var ce *ConnectionError
	if !errors.As(err, &ce) {
		return false
	}
	var op *net.OpError
	if !errors.As(ce.Err, &op) || op.Op != "dial" {
		return false
	}
	return errors.Is(op.Err, syscall.ECONNREFUSED) || errors.Is(op.Err, fs.ErrNotExist) ||
		errors.Is(op.Err, syscall.ENOENT)
}

// decodeError turns a non-2xx response into an *APIError.
func decodeError(resp *http.Response) error {
	e := &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get(api.RequestIDHeader)}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	e.body = b
	var body api.Error
	if json.Unmarshal(b, &body) == nil && (body.Code != "" || body.Message != "") {
		e.Code, e.Message, e.Reason = body.Code, body.Message, body.Reason
		if body.RequestID != "" {
			e.RequestID = body.RequestID
		}
	} else {
		e.Code = codeForStatus(resp.StatusCode)
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		e.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	return e
}

// parseRetryAfter parses a Retry-After value, delay-seconds or an HTTP date
// (RFC 9110 section 10.2.3), relative to now; 0 when absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, int64(math.MaxInt64/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// streamError turns an error event of a stream into an *APIError.
func streamError(e *api.Error) error {
	if e == nil {
		return &APIError{Code: CodeInternal, Message: "daemon reported an error without details"}
	}
	return &APIError{Code: e.Code, Message: e.Message, RequestID: e.RequestID, Reason: e.Reason}
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusPreconditionFailed:
		return CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusGatewayTimeout:
		return CodeDeadlineExceeded
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusNotImplemented:
		return CodeNotImplemented
	}
	return CodeInternal
}

func hasCode(err error, codes ...string) bool {
	var e *APIError
	if !errors.As(err, &e) {
		return false
	}
	for _, c := range codes {
		if e.Code == c {
			return true
		}
	}
	return false
}

// IsNotFound reports whether err is the daemon saying the object does not exist.
func IsNotFound(err error) bool { return hasCode(err, CodeNotFound) }

// IsConflict reports whether the object's state (or an existing object of the
// same name) does not allow the operation.
func IsConflict(err error) bool { return hasCode(err, CodeConflict, CodeAlreadyExists) }

// IsAlreadyExists reports whether an object of that name already exists.
func IsAlreadyExists(err error) bool { return hasCode(err, CodeAlreadyExists) }

// IsInvalidArgument reports whether the daemon rejected the request's arguments.
func IsInvalidArgument(err error) bool { return hasCode(err, CodeInvalidArgument) }

// IsFailedPrecondition reports a request the daemon's state or settings
// refuse (412: a memory checkpoint on a backend without them, or of a
// sandbox whose memory holds secrets), or an exec whose output failed its
// WithOutputSchema.
func IsFailedPrecondition(err error) bool { return hasCode(err, CodeFailedPrecondition) }

// IsUnauthenticated reports whether the API key was missing or wrong.
func IsUnauthenticated(err error) bool { return hasCode(err, CodeUnauthenticated) }

// IsPermissionDenied reports whether the operation is not allowed.
func IsPermissionDenied(err error) bool { return hasCode(err, CodePermissionDenied) }

// IsResourceExhausted reports whether a limit was reached, such as a
// tenant's quota; (*APIError).RetryAfter may say when to try again.
func IsResourceExhausted(err error) bool { return hasCode(err, CodeResourceExhausted) }

// IsUnavailable reports whether the daemon (or a sandbox's guest) is
// temporarily unable to serve the request.
func IsUnavailable(err error) bool { return hasCode(err, CodeUnavailable) }

// RequestID returns the daemon's request id carried by err, or "".
func RequestID(err error) string {
	var e *APIError
	if errors.As(err, &e) {
		return e.RequestID
	}
	return ""
}

// wrapf returns err with context (format and args: the call the SDK was
// making), "getting sandbox X: <err>". The daemon's message of an error
// may already begin with that very context (its services name the
// operation and the sandbox: "exec in sandbox X: ..."); then err is
// returned as it is, so that a message never says it twice. errors.As and
// the Is* helpers work on the result either way.
func wrapf(err error, format string, args ...any) error {
	context := fmt.Sprintf(format, args...)
	if ae, ok := err.(*APIError); ok && strings.HasPrefix(ae.Message, context+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", context, err)
}
