package proto

import (
	"fmt"
	"path"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// CheckPath validates a path of a file operation as both sides see it:
// non-empty, absolute, no NUL byte, at most MaxPathLen bytes. The client
// checks before a round trip; the guest checks again, as it trusts no one.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty path: %w", errdefs.ErrInvalidArgument)
	case len(p) > MaxPathLen:
		return fmt.Errorf("path of %d bytes exceeds %d: %w", len(p), MaxPathLen, errdefs.ErrInvalidArgument)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	case !path.IsAbs(p):
		return fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}
