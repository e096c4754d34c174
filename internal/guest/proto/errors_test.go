package proto

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// An error's category and reason cross the guest protocol; its text is
// the guest's message alone (the client says once that it came from the
// guest).
func TestErrorRoundTrip(t *testing.T) {
	sent := errdefs.WithReason(fmt.Errorf("executable %q not found in PATH: %w", "x", errdefs.ErrNotFound), errdefs.ReasonCommandNotFound)
	got := NewError(sent).Err()
	if !errors.Is(got, errdefs.ErrNotFound) || errdefs.Reason(got) != errdefs.ReasonCommandNotFound || got.Error() != sent.Error() {
		t.Fatalf("round trip of %v = %v (reason %q)", sent, got, errdefs.Reason(got))
	}
}
