package audit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// trackers routes each upper dir to the tracker (one fanotify group,
// fanotify.go) of its filesystem, made on first use and closed when it
// follows no upper dir any more. A group per filesystem, because events
// name their filesystem by fsid, which need not be unique: the
// loop-device filesystems of disk quotas (internal/diskquota) are made
// from one image and share theirs. Its methods are safe for concurrent
// use.
type trackers struct {
	dir   string
	limit int
	log   *slog.Logger

	// mu guards the fields below.
	mu     sync.Mutex
	byDev  map[uint64]*tracker
	closed bool
	// runs tracked and walked by groups since closed
	tracked, walked uint64
}

// newTrackers checks that the kernel reports what a sandbox does
// through overlayfs on the filesystem of dir (probeOverlay) and returns
// the trackers, their barriers in dir.
func newTrackers(dir string, limit int, log *slog.Logger) (*trackers, error) {
	// Barriers and probes left by a daemon that died.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	t, err := newTracker(dir, limit, log)
	if err != nil {
		return nil, err
	}
	t.close()
	return &trackers{dir: t.dir, limit: limit, log: log, byDev: map[uint64]*tracker{}}, nil
}

// group returns the tracker of upper's filesystem, started when create
// says so.
func (ts *trackers) group(upper string, create bool) (*tracker, error) {
	var st unix.Stat_t
	if err := unix.Stat(upper, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", upper, errdefs.ErrUnavailable)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return nil, fmt.Errorf("change trackers closed: %w", errdefs.ErrUnavailable)
	}
	if g := ts.byDev[st.Dev]; g != nil {
		return g, nil
	}
	if !create {
		return nil, fmt.Errorf("%s is not tracked: %w", upper, errdefs.ErrUnavailable)
	}
	g, err := startTracker(ts.dir, ts.limit, ts.log)
	if err != nil {
		return nil, fmt.Errorf("following the filesystem of %s: %w", upper, err)
	}
	ts.byDev[st.Dev] = g
	return g, nil
}

// begin is tracker.begin on upper's group.
func (ts *trackers) begin(ctx context.Context, upper string, absorb bool) error {
	g, err := ts.group(upper, true)
	if err != nil {
		return err
	}
	return g.begin(ctx, upper, absorb)
}

// end is tracker.end on upper's group.
func (ts *trackers) end(ctx context.Context, upper string) ([]fileChange, bool, error) {
	g, err := ts.group(upper, false)
	if err != nil {
		return nil, false, err
	}
	return g.end(ctx, upper)
}

// forget stops following upper, and its group when it has no other.
func (ts *trackers) forget(upper string) {
	g, err := ts.group(upper, false)
	if err != nil {
		return
	}
	g.forget(upper)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if !g.idle() {
		return
	}
	for dev, o := range ts.byDev {
		if o == g {
			delete(ts.byDev, dev)
		}
	}
	g.close()
	g.mu.Lock()
	ts.tracked += g.tracked
	ts.walked += g.walked
	g.mu.Unlock()
}

// close closes every group. Idempotent.
func (ts *trackers) close() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.closed = true
	for dev, g := range ts.byDev {
		g.close()
		delete(ts.byDev, dev)
	}
}

// stats returns how many runs were tracked and how many of them walked
// (events lost).
func (ts *trackers) stats() (tracked, walked uint64) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	tracked, walked = ts.tracked, ts.walked
	for _, g := range ts.byDev {
		g.mu.Lock()
		tracked += g.tracked
		walked += g.walked
		g.mu.Unlock()
	}
	return tracked, walked
}
