package sandbox

import (
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// A name is never shaped like an id (so never another sandbox's id), and
// every id newID makes is refused as a name.
func TestValidName(t *testing.T) {
	for _, ok := range []string{"web1", "hermes", "nightly-3f2a", "abcdef12345", "abcdef1234567", "abcdef-12345"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Web1", "-web", "abcdef123456", "000000000000", newID()} {
		if err := ValidName(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidName(%q) = %v, want invalid argument", bad, err)
		}
	}
}
