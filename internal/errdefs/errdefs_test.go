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
