package errdefs

import "errors"

// HTTPStatus is the HTTP status of err's category: the one table the HTTP
// edges (internal/httpapi, internal/e2b) answer with, so a category cannot
// mean one status on one front door and another on the next. 500 for an
// error of no category. The status is the transport's concern: nothing
// below the edges calls this.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrTooLarge):
		return 413
	case errors.Is(err, ErrInvalidArgument):
		return 400
	case errors.Is(err, ErrUnauthenticated):
		return 401
	case errors.Is(err, ErrPermissionDenied):
		return 403
	case errors.Is(err, ErrNotFound):
		return 404
	case errors.Is(err, ErrAlreadyExists), errors.Is(err, ErrConflict):
		return 409
	case errors.Is(err, ErrFailedPrecondition):
		return 412
	case errors.Is(err, ErrResourceExhausted):
		return 429
	case errors.Is(err, ErrNotImplemented):
		return 501
	case errors.Is(err, ErrUnavailable):
		return 503
	case errors.Is(err, ErrDeadlineExceeded):
		return 504
	default:
		return 500
	}
}
