// Package ratelimit holds per-key token buckets: each key (a tenant, an
// API key) may make Burst requests at once and Rate requests per second on
// average.
package ratelimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxIdleKeys bounds the buckets kept: beyond it, full buckets (keys that
// have been quiet long enough to be back at Burst) are dropped; they would
// be recreated full, so nothing changes for their keys.
const maxIdleKeys = 4096

// PerKey is a token bucket per key. The zero value is not usable: call New.
// It is safe for concurrent use.
type PerKey struct {
	rate  rate.Limit
	burst int

	// mu guards buckets.
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// New returns buckets of perSecond tokens a second holding at most burst
// (at least 1). perSecond <= 0 means no limit: Allow always says yes.
func New(perSecond float64, burst int) *PerKey {
	return &PerKey{rate: rate.Limit(perSecond), burst: max(burst, 1), buckets: map[string]*rate.Limiter{}}
}

// Allow takes a token from key's bucket. When there is none it takes
// nothing and returns how long until there will be one.
func (p *PerKey) Allow(key string) (time.Duration, bool) {
	if p.rate <= 0 {
		return 0, true
	}
	now := time.Now()
	p.mu.Lock()
	b, ok := p.buckets[key]
	if !ok {
		if len(p.buckets) >= maxIdleKeys {
			p.pruneLocked(now)
		}
		b = rate.NewLimiter(p.rate, p.burst)
		p.buckets[key] = b
	}
	p.mu.Unlock()
	r := b.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// pruneLocked drops the buckets that are full.
func (p *PerKey) pruneLocked(now time.Time) {
	for k, b := range p.buckets {
		if b.TokensAt(now) >= float64(p.burst) {
			delete(p.buckets, k)
		}
	}
}
