// Package clock is agentbox's one time source abstraction: the code that
// arms timers (sandbox idle policies and lifetimes, pipeline records,
// usage sampling, schedules) reads time through a Clock so tests drive it
// with clocktest.Fake instead of sleeping.
package clock

import "time"

// Clock is a time source. Implementations are safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed (at once
	// when d <= 0). The returned Timer can cancel the call.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did. Stopping a timer again, or one that has fired, returns false.
	Stop() bool
}

// Real is the wall clock (package time).
type Real struct{}

// Now implements Clock.
func (Real) Now() time.Time { return time.Now() }

// AfterFunc implements Clock with time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var _ Clock = Real{}
