package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Summary condenses the samples of one measurement.
type Summary struct {
	N      int
	Median time.Duration
	P90    time.Duration
	Min    time.Duration
	Max    time.Duration
}

// summarize computes the summary of samples. Percentiles use the
// nearest-rank method on the sorted samples, so every reported value is a
// value that was actually measured. An empty input gives a zero Summary.
func summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Summary{
		N:      len(s),
		Median: percentile(s, 50),
		P90:    percentile(s, 90),
		Min:    s[0],
		Max:    s[len(s)-1],
	}
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method. sorted must be non-empty and ascending.
func percentile(sorted []time.Duration, p int) time.Duration {
	// rank = ceil(p/100 * n), 1-based.
	rank := (p*len(sorted) + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// timeN runs fn warmup times untimed, then n times timed, and returns the
// n durations. It stops at the first error or when ctx is done. fn measures
// one full operation; setup or teardown that must not be timed belongs in
// the optional after func, which runs untimed after every call of fn.
func timeN(ctx context.Context, n, warmup int, fn func(i int) error, after func(i int) error) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, n)
	for i := 0; i < warmup+n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		start := time.Now()
		err := fn(i)
		d := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i, err)
		}
		if after != nil {
			if err := after(i); err != nil {
				return nil, fmt.Errorf("cleanup after run %d: %w", i, err)
			}
		}
		if i >= warmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// ms formats d in milliseconds with a precision that suits its size.
func ms(d time.Duration) string {
	f := float64(d) / float64(time.Millisecond)
	switch {
	case f >= 100:
		return fmt.Sprintf("%.0f ms", f)
	case f >= 10:
		return fmt.Sprintf("%.1f ms", f)
	default:
		return fmt.Sprintf("%.2f ms", f)
	}
}
