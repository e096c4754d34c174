package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// statusOf maps an error category to its one HTTP status. This is the only
// place in the daemon where transport statuses are chosen.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusPreconditionFailed
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errdefs.ErrDeadlineExceeded):
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// publicError is what the client may see of err: its category and, for 4xx,
// its text. 5xx text stays in the log (see requestLog), except for the
// categories whose meaning is the message (503, 501, 504), which get a
// fixed text.
func publicError(err error, requestID string) (int, api.Error) {
	status := statusOf(err)
	e := api.Error{Code: errdefs.Code(err), RequestID: requestID}
	switch {
	case status == http.StatusRequestEntityTooLarge:
		e.Code = "too_large"
		e.Message = err.Error()
	case status < 500:
		e.Message = err.Error()
	case status == http.StatusServiceUnavailable:
		e.Message = "service unavailable"
	case status == http.StatusNotImplemented:
		e.Message = "not implemented"
	case status == http.StatusGatewayTimeout:
		e.Message = "deadline exceeded"
	default:
		e.Code = "internal"
		e.Message = "internal error"
	}
	return status, e
}

// writeError sends err as an api.Error body with the status of its category
// and records err for the request's log line.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	rs := stateFrom(r.Context())
	status, body := publicError(err, rs.id)
	rs.err = err
	if d, ok := errdefs.RetryAfter(err); ok && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(max(d.Seconds(), 1))), 10))
	}
	writeJSON(w, status, body)
}

// errorf builds an invalid-argument error for client input.
func errorf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// writeJSON sends v with status. Encoding errors after the header are only
// visible as a cut-short body; they cannot happen for api types.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
