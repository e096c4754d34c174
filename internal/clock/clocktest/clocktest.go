// Package clocktest provides a fake clock.Clock for tests: time moves only
// when the test calls Advance, so no test depends on timing.
package clocktest

import (
	"sort"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/clock"
)

// Fake is a clock.Clock that moves only when Advance is called. It is
// safe for concurrent use; timer callbacks run without its lock held, so
// they may read the clock and arm or stop timers.
type Fake struct {
	// mu guards the fields below.
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

var _ clock.Clock = (*Fake)(nil)

type fakeTimer struct {
	c       *Fake
	at      time.Time
	f       func()
	stopped bool // stopped or fired; guarded by c.mu
}

// NewFake returns a fake clock reading t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now implements clock.Clock.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements clock.Clock: f runs inside a later Advance that
// reaches now+d (the next one when d <= 0).
func (c *Fake) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop implements clock.Timer.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock forward by d. Every timer that falls due on the
// way, including those armed by callbacks it runs, is called in deadline
// order (ties in the order they were armed), synchronously, with the clock
// reading its deadline (or the time before Advance, for an overdue one);
// when Advance returns the clock reads the old time plus d and no timer
// due by then is left.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		var next *fakeTimer
		for i, t := range c.timers {
			if t.stopped {
				continue
			}
			if !t.at.After(end) {
				next = t
				c.timers = append(c.timers[:i:i], c.timers[i+1:]...)
			}
			break
		}
		if next == nil {
			c.timers = deleteStopped(c.timers)
			c.now = end
			c.mu.Unlock()
			return
		}
		next.stopped = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
	}
}

func deleteStopped(ts []*fakeTimer) []*fakeTimer {
	out := ts[:0]
	for _, t := range ts {
		if !t.stopped {
			out = append(out, t)
		}
	}
	return out
}
