package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestCheckTraversable(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // t.TempDir makes them 0700
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	open := filepath.Join(base, "open")
	closed := filepath.Join(base, "closed")
	for d, mode := range map[string]os.FileMode{open: 0o711, closed: 0o700} {
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkTraversable(filepath.Join(open, "data")); err != nil {
		t.Errorf("data dir under 0711 parents: %v", err)
	}
	err := checkTraversable(filepath.Join(closed, "data"))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("data dir under a 0700 parent: %v, want failed precondition", err)
	}
}
