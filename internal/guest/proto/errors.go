package proto

import (
	"errors"
	"syscall"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Error is the payload of FrameError.
type Error struct {
	Code    string `json:"code"`             // errdefs code: "not_found", "invalid_argument", ...
	Message string `json:"message"`          // human-readable
	Reason  string `json:"reason,omitempty"` // errdefs reason refining the code, e.g. "command_not_found"
}

// MaxErrorMessage bounds the message a client keeps from an Error frame.
const MaxErrorMessage = 4096

// errnoCategories maps syscall errors onto error categories.
var errnoCategories = map[syscall.Errno]error{
	syscall.ENOENT:       errdefs.ErrNotFound,
	syscall.ENOTDIR:      errdefs.ErrNotFound,
	syscall.ESRCH:        errdefs.ErrNotFound,
	syscall.EEXIST:       errdefs.ErrAlreadyExists,
	syscall.EACCES:       errdefs.ErrPermissionDenied,
	syscall.EPERM:        errdefs.ErrPermissionDenied,
	syscall.EROFS:        errdefs.ErrPermissionDenied,
	syscall.EISDIR:       errdefs.ErrInvalidArgument,
	syscall.EINVAL:       errdefs.ErrInvalidArgument,
	syscall.ENAMETOOLONG: errdefs.ErrInvalidArgument,
	syscall.ELOOP:        errdefs.ErrInvalidArgument,
	syscall.EXDEV:        errdefs.ErrInvalidArgument,
	syscall.ENOEXEC:      errdefs.ErrInvalidArgument,
	syscall.ENXIO:        errdefs.ErrInvalidArgument, // a device or socket opened as a file
	syscall.ENODEV:       errdefs.ErrInvalidArgument,
	syscall.ENOTEMPTY:    errdefs.ErrConflict,
	syscall.EBUSY:        errdefs.ErrConflict,
	syscall.ENOSPC:       errdefs.ErrResourceExhausted,
	syscall.EDQUOT:       errdefs.ErrResourceExhausted,
	syscall.EMFILE:       errdefs.ErrResourceExhausted,
	syscall.ENFILE:       errdefs.ErrResourceExhausted,
	syscall.EAGAIN:       errdefs.ErrResourceExhausted,
	syscall.ENOMEM:       errdefs.ErrResourceExhausted,
	syscall.EFBIG:        errdefs.ErrTooLarge,
}

// Category returns the errdefs sentinel for err: the category err already
// wraps, else the one of the syscall.Errno it wraps, else ErrInternal.
func Category(err error) error {
	if code := errdefs.Code(err); code != "internal" {
		return FromCode(code)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if c, ok := errnoCategories[errno]; ok {
			return c
		}
	}
	return errdefs.ErrInternal
}

// NewError builds the Error frame payload for err.
func NewError(err error) Error {
	return Error{Code: errdefs.Code(Category(err)), Message: err.Error(), Reason: errdefs.Reason(err)}
}

// sentinels lists the categories a guest may report, by code.
var sentinels = map[string]error{
	"invalid_argument":    errdefs.ErrInvalidArgument,
	"permission_denied":   errdefs.ErrPermissionDenied,
	"not_found":           errdefs.ErrNotFound,
	"already_exists":      errdefs.ErrAlreadyExists,
	"conflict":            errdefs.ErrConflict,
	"failed_precondition": errdefs.ErrFailedPrecondition,
	"too_large":           errdefs.ErrTooLarge,
	"resource_exhausted":  errdefs.ErrResourceExhausted,
	"deadline_exceeded":   errdefs.ErrDeadlineExceeded,
	"unavailable":         errdefs.ErrUnavailable,
	"not_implemented":     errdefs.ErrNotImplemented,
	"internal":            errdefs.ErrInternal,
}

// FromCode returns the sentinel for an errdefs code; unknown codes (and
// "unauthenticated", which a guest has no business reporting) are
// ErrInternal.
func FromCode(code string) error {
	if e, ok := sentinels[code]; ok {
		return e
	}
	return errdefs.ErrInternal
}

// Err turns a received Error into a Go error wrapping its category. The
// message is cut to MaxErrorMessage bytes; it comes from the guest and is
// untrusted text.
func (e Error) Err() error {
	msg := e.Message
	if len(msg) > MaxErrorMessage {
		msg = msg[:MaxErrorMessage] + "..."
	}
	return &RemoteError{Msg: msg, Category: FromCode(e.Code), Why: e.Reason}
}

// RemoteError is an error reported by the guest. Its text is the guest's
// message alone: the client that received it says it came from the guest
// ("guest exec: ..."), once.
type RemoteError struct {
	Msg      string // the guest's message (untrusted)
	Category error  // an errdefs sentinel
	Why      string // the errdefs reason, if any (untrusted)
}

// ErrorReason returns the reason the guest gave (errdefs.Reason reads it).
func (e *RemoteError) ErrorReason() string { return e.Why }

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the category so errors.Is works.
func (e *RemoteError) Unwrap() error { return e.Category }
