package guest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// lookPath's errors carry the reason the CLI turns into 127 (not found)
// or 126 (not executable), with the category of each.
func TestLookPathReasons(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file, reason string
		category     error
	}{
		{"nosuchcommand", errdefs.ReasonCommandNotFound, errdefs.ErrNotFound},
		{filepath.Join(dir, "missing"), errdefs.ReasonCommandNotFound, nil},
		{plain, errdefs.ReasonCommandNotExecutable, errdefs.ErrPermissionDenied},
		{dir, errdefs.ReasonCommandNotExecutable, errdefs.ErrPermissionDenied},
	} {
		_, err := lookPath(c.file, dir, "/")
		if errdefs.Reason(err) != c.reason || (c.category != nil && errdefs.Code(err) != errdefs.Code(c.category)) {
			t.Errorf("lookPath(%s) = %v (reason %q), want reason %q", c.file, err, errdefs.Reason(err), c.reason)
		}
	}
}
