package native

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/agentbox/agentbox/internal/runtime/native/forker"
)

// ForkerArgs are the arguments that make a runner binary serve as the
// guests' forker (package forker): cmd/agentbox's "agentbox guest fork".
var ForkerArgs = []string{"guest", "fork"}

// HoldArgs are the arguments that make a runner binary wait until its
// stdin closes (cmd/agentbox's "agentbox guest hold"): it holds the user
// namespace of an idmapped mount while the backend opens it (mounts.go).
var HoldArgs = []string{"guest", "hold"}

// guestForker starts guests through a forker helper (see package forker):
// path run with ForkerArgs, started on first use and again after it died.
// A nil *guestForker starts them from this process. Safe for concurrent
// use.
type guestForker struct {
	path string
	log  *slog.Logger

	// mu guards the fields below.
	mu     sync.Mutex
	client *forker.Client
	closed bool
}

func newGuestForker(path string, log *slog.Logger) *guestForker {
	if path == "" {
		return nil
	}
	return &guestForker{path: path, log: log}
}

// spawn starts req's process with fds through the helper and returns its
// pid and a pidfd for it. A helper found dead is replaced once.
func (f *guestForker) spawn(req forker.Request, fds []int) (int, int, error) {
	for attempt := 0; ; attempt++ {
		c, err := f.get()
		if err != nil {
			return 0, -1, err
		}
		pid, pidfd, err := c.Spawn(req, fds)
		if errors.Is(err, forker.ErrClosed) && attempt == 0 {
			f.log.Warn("guest forker exited; starting another", "err", err)
			f.drop(c)
			continue
		}
		return pid, pidfd, err
	}
}

func (f *guestForker) get() (*forker.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("guest forker: %w", forker.ErrClosed)
	}
	if f.client == nil {
		c, err := forker.Start(f.path, ForkerArgs...)
		if err != nil {
			return nil, err
		}
		f.client = c
	}
	return f.client, nil
}

// drop forgets c if it is still the current helper.
func (f *guestForker) drop(c *forker.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.client == c {
		f.client = nil
	}
	_ = c.Close()
}

// close stops the helper (the guests it started live on); later spawns
// fail.
func (f *guestForker) close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.client != nil {
		_ = f.client.Close()
		f.client = nil
	}
}
