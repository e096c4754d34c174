// Package errdefs defines the error categories shared by every layer of
// agentbox. Core code wraps one of these sentinels with context
// ("creating sandbox %s: %w"); only the API edge translates a category into a
// transport status (see internal/httpapi). Callers test categories with
// errors.Is, never by matching message text.
package errdefs

import (
	"errors"
	"time"
)

// The categories. Each maps to exactly one HTTP status at the API edge.
var (
	ErrInvalidArgument    = errors.New("invalid argument")    // 400
	ErrUnauthenticated    = errors.New("unauthenticated")     // 401
	ErrPermissionDenied   = errors.New("permission denied")   // 403
	ErrNotFound           = errors.New("not found")           // 404
	ErrAlreadyExists      = errors.New("already exists")      // 409
	ErrConflict           = errors.New("conflict")            // 409 (state does not allow the operation)
	ErrFailedPrecondition = errors.New("failed precondition") // 412
	ErrTooLarge           = errors.New("too large")           // 413
	ErrResourceExhausted  = errors.New("resource exhausted")  // 429
	ErrDeadlineExceeded   = errors.New("deadline exceeded")   // 504
	ErrUnavailable        = errors.New("unavailable")         // 503
	ErrNotImplemented     = errors.New("not implemented")     // 501
	ErrInternal           = errors.New("internal error")      // 500
)

// Is* helpers read better at call sites than errors.Is with a sentinel.
func IsNotFound(err error) bool        { return errors.Is(err, ErrNotFound) }
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }
func IsConflict(err error) bool        { return errors.Is(err, ErrConflict) }
func IsAlreadyExists(err error) bool   { return errors.Is(err, ErrAlreadyExists) }
func IsUnavailable(err error) bool     { return errors.Is(err, ErrUnavailable) }

// Code returns the stable machine-readable code for err's category, as sent
// to clients in the "code" field of an error body ("not_found", ...). Errors
// of no known category are "internal".
func Code(err error) string {
	for _, c := range categories {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "internal"
}

var categories = []struct {
	err  error
	code string
}{
	{ErrInvalidArgument, "invalid_argument"},
	{ErrUnauthenticated, "unauthenticated"},
	{ErrPermissionDenied, "permission_denied"},
	{ErrNotFound, "not_found"},
	{ErrAlreadyExists, "already_exists"},
	{ErrConflict, "conflict"},
	{ErrFailedPrecondition, "failed_precondition"},
	{ErrTooLarge, "too_large"},
	{ErrResourceExhausted, "resource_exhausted"},
	{ErrDeadlineExceeded, "deadline_exceeded"},
	{ErrUnavailable, "unavailable"},
	{ErrNotImplemented, "not_implemented"},
	{ErrInternal, "internal"},
}

// RetryAfterError marks an error (typically ErrResourceExhausted or
// ErrUnavailable) with the time after which the same request may succeed.
// The API edge sends it as a Retry-After header.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// WithRetryAfter wraps err with a retry hint of d (rounded up to a whole
// second by the edge).
func WithRetryAfter(err error, d time.Duration) error {
	return &RetryAfterError{Err: err, After: d}
}

// RetryAfter returns the retry hint err carries, if any.
func RetryAfter(err error) (time.Duration, bool) {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra.After, true
	}
	return 0, false
}

// Reasons refine a category where a client acts on the difference: the CLI
// exits 127 for a command that is not found and 126 for one that cannot
// be executed, as shells and docker do. The API sends them in the
// "reason" field of an error body.
const (
	ReasonCommandNotFound      = "command_not_found"      // an exec's executable does not exist (ErrNotFound)
	ReasonCommandNotExecutable = "command_not_executable" // it exists but cannot be executed (ErrPermissionDenied)
)

// reasonError attaches a reason to an error; its text and category are
// err's.
type reasonError struct {
	err    error
	reason string
}

func (e *reasonError) Error() string       { return e.err.Error() }
func (e *reasonError) Unwrap() error       { return e.err }
func (e *reasonError) ErrorReason() string { return e.reason }

// WithReason returns err carrying reason (one of the Reason constants).
func WithReason(err error, reason string) error { return &reasonError{err: err, reason: reason} }

// Reason returns the reason err (or an error it wraps) carries: anything
// with an ErrorReason() string method, such as WithReason's errors and
// errors relayed from a guest. "" when none.
func Reason(err error) string {
	var r interface{ ErrorReason() string }
	if errors.As(err, &r) {
		return r.ErrorReason()
	}
	return ""
}

// FromCode returns the category whose Code is code (ErrInternal for an
// unknown one): for errors that crossed a process boundary as a code.
func FromCode(code string) error {
	for _, c := range categories {
		if c.code == code {
			return c.err
		}
	}
	return ErrInternal
}
