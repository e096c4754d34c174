package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// serveWith serves one GET of a route answered by fn through the whole
// middleware chain. It returns the response, the log, and what ServeHTTP
// panicked with (nil when it returned).
func serveWith(t *testing.T, fn handlerFunc) (rec *httptest.ResponseRecorder, logs string, panicked any) {
	t.Helper()
	h, buf := newTestHandler(t, &fakeService{}, Options{})
	h.(*handler).mux.HandleFunc("GET /v1/test-handle", handle(fn))
	rec = httptest.NewRecorder()
	func() {
		defer func() { panicked = recover() }()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/test-handle", nil))
	}()
	return rec, buf.String(), panicked
}

func TestHandleErrorBeforeResponse(t *testing.T) {
	rec, logs, panicked := serveWith(t, func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("no such thing: %w", errdefs.ErrNotFound)
	})
	if panicked != nil {
		t.Fatalf("panicked with %v", panicked)
	}
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", rec.Code)
	}
	if e := decodeError(t, rec); e.Code != "not_found" || e.Message != "no such thing: not found" || e.RequestID == "" {
		t.Fatalf("error body %+v", e)
	}
	if !strings.Contains(logs, "status=404") || !strings.Contains(logs, `err="no such thing: not found"`) {
		t.Fatalf("log line lacks the status or the error:\n%s", logs)
	}
}

func TestHandleInternalErrorStaysInTheLog(t *testing.T) {
	rec, logs, _ := serveWith(t, func(w http.ResponseWriter, r *http.Request) error {
		return errors.New("opening /var/lib/agentbox/secret-path: boom")
	})
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	if e := decodeError(t, rec); e.Code != "internal" || e.Message != "internal error" {
		t.Fatalf("error body %+v: want the fixed internal message", e)
	}
	if !strings.Contains(logs, "secret-path") {
		t.Fatalf("the log line lacks the error:\n%s", logs)
	}
}

func TestHandleErrorAfterResponseStartedAborts(t *testing.T) {
	rec, logs, panicked := serveWith(t, func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("partial"))
		return fmt.Errorf("sending archive: %w", errors.New("disk gone"))
	})
	if panicked != http.ErrAbortHandler {
		t.Fatalf("panicked with %v, want http.ErrAbortHandler (the connection is cut)", panicked)
	}
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/x-tar" || rec.Body.String() != "partial" {
		t.Fatalf("status %d, content type %q, body %q: the started response must be left as it was", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
	if !strings.Contains(logs, "status=200") || !strings.Contains(logs, `err="sending archive: disk gone"`) {
		t.Fatalf("log line lacks the status or the error:\n%s", logs)
	}
}

func TestHandleErrorBody(t *testing.T) {
	rec, _, _ := serveWith(t, func(w http.ResponseWriter, r *http.Request) error {
		return withErrorBody(fmt.Errorf("merge: %w", errdefs.ErrConflict), func(e api.Error) any {
			return api.MergeConflictError{Error: e, Conflicts: []api.MergeConflict{{Path: "/x"}}}
		})
	})
	body := rec.Body.String()
	if rec.Code != http.StatusConflict || !strings.Contains(body, `"conflicts":[{"path":"/x"}]`) || !strings.Contains(body, `"code":"conflict"`) {
		t.Fatalf("status %d body %s", rec.Code, body)
	}
}
