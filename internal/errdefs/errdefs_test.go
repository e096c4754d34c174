package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

// FromCode inverts Code for every category; an unknown code is internal.
func TestFromCode(t *testing.T) {
	for _, c := range categories {
		err := fmt.Errorf("wrapped: %w", c.err)
		if got := FromCode(Code(err)); !errors.Is(got, c.err) {
			t.Errorf("FromCode(%q) = %v, want %v", c.code, got, c.err)
		}
	}
	if got := FromCode("no such code"); got != ErrInternal {
		t.Errorf("unknown code: %v", got)
	}
}

// TestHTTPStatus: every category has its status, wrapped or not, and an
// error of no category is a server error.
func TestHTTPStatus(t *testing.T) {
	for err, want := range map[error]int{
		ErrInvalidArgument: 400, ErrUnauthenticated: 401, ErrPermissionDenied: 403, ErrNotFound: 404,
		ErrAlreadyExists: 409, ErrConflict: 409, ErrFailedPrecondition: 412, ErrTooLarge: 413,
		ErrResourceExhausted: 429, ErrNotImplemented: 501, ErrUnavailable: 503, ErrDeadlineExceeded: 504,
		errors.New("plain"): 500,
	} {
		if got := HTTPStatus(fmt.Errorf("doing x: %w", err)); got != want {
			t.Errorf("%v: %d, want %d", err, got, want)
		}
	}
}
