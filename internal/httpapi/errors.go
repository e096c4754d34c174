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

// statusOf maps an error category to its one HTTP status
// (errdefs.HTTPStatus); a body over its limit is 413.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return errdefs.HTTPStatus(err)
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
		e.Reason = errdefs.Reason(err)
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

// handlerFunc is a route handler that returns its error instead of
// writing it: handle turns the error into the response. A handler returns
// nil when it has answered (or, for a stream that reports its errors in
// the stream, when it has sent the final error event itself).
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle adapts fn to net/http. It is the one place where a handler's
// error becomes what the client sees and what is logged:
//   - before the response has started, err is sent by writeError: the
//     status of its category (statusOf), an api.Error body with the
//     client-safe text and the request id (publicError), and err itself
//     on the request's log line;
//   - after the response has started (a file, an archive or an export
//     being sent) the status can no longer change: err goes to the log
//     line and the connection is aborted (http.ErrAbortHandler), so the
//     client sees a broken transfer rather than a complete-looking one.
//
// New applies it to every route, and ServeHTTP to the access checks
// (dispatch). Streams that report errors in the stream itself (exec and
// attach, template builds: an error event) note the error for the log
// line (reqState.err) and return nil.
func handle(fn handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := fn(w, r)
		if err == nil {
			return
		}
		rs := stateFrom(r.Context())
		if rs.started() {
			rs.err = err
			panic(http.ErrAbortHandler)
		}
		writeError(w, r, err)
	}
}

// writeError sends err as an api.Error body (or the body an errorBody
// builds from it) with the status of its category and records err for the
// request's log line. Handlers return their errors to handle instead.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	rs := stateFrom(r.Context())
	status, pub := publicError(err, rs.id)
	rs.err = err
	if d, ok := errdefs.RetryAfter(err); ok && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(max(d.Seconds(), 1))), 10))
	}
	var body any = pub
	var eb *errorBody
	if errors.As(err, &eb) {
		body = eb.body(pub)
	}
	writeJSON(w, status, body)
}

// errorBody is an error whose response body carries more than the
// api.Error: body builds it from the api.Error the client would get.
// Status, message and log line are those of the wrapped error.
type errorBody struct {
	err  error
	body func(api.Error) any
}

func (e *errorBody) Error() string { return e.err.Error() }
func (e *errorBody) Unwrap() error { return e.err }

// withErrorBody returns err answered with the body body builds.
func withErrorBody(err error, body func(api.Error) any) error {
	return &errorBody{err: err, body: body}
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
