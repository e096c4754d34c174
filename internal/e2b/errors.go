package e2b

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// apiError is E2B's error body: {"code": <HTTP status>, "message": "..."}.
// The SDK maps on code (kill answers false only for code 404).
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf is the HTTP status of an error's category (errdefs.HTTPStatus,
// the table the API edge answers with too); a body over its limit is 413.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return errdefs.HTTPStatus(err)
}

// publicMessage is what the client may see of err: its text for client
// errors, the category for server errors (whose text is only logged).
func publicMessage(err error, status int) string {
	if status < 500 {
		return err.Error()
	}
	return errdefs.Code(err)
}

// writeError answers err in E2B's shape and logs server errors.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status := statusOf(err)
	if after, ok := errdefs.RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(after.Seconds()+0.999))))
	}
	if status >= 500 {
		log.ErrorContext(r.Context(), "e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, status, apiError{Code: status, Message: publicMessage(err, status)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// connectError maps err's category to a Connect error, keeping server
// errors' text out of the answer.
func connectError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrFailedPrecondition):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrNotImplemented):
		code = connect.CodeUnimplemented
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, errdefs.ErrDeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	if code == connect.CodeInternal {
		return connect.NewError(code, errors.New(errdefs.Code(err)))
	}
	return connect.NewError(code, err)
}
