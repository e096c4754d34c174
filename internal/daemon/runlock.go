package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// runLockName is the lock file in the directory of the API socket. That
// directory also holds the guests' sockets (sb/), which a daemon's
// start-up sweeps of every socket no record of its own claims: two daemons
// there would remove each other's.
const runLockName = ".agentbox.lock"

// lockRunDir takes an exclusive flock on the lock file in dir (made if
// missing), held until the returned file is closed or the process exits,
// so a crashed daemon never holds it against its successor. It fails with
// errdefs.ErrUnavailable while another daemon holds it.
func lockRunDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	name := filepath.Join(dir, runLockName)
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("socket directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("socket directory %s is used by another agentbox daemon (%s is locked; give each daemon a socket in a directory of its own): %w", dir, name, errdefs.ErrUnavailable)
	}
	return f, nil
}
