package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

func durations(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestSummarize(t *testing.T) {
	// 1..10 shuffled: median (nearest rank) is 5, p90 is 9.
	s := summarize(durations(7, 3, 10, 1, 5, 9, 2, 8, 4, 6))
	want := Summary{N: 10, Median: 5 * time.Millisecond, P90: 9 * time.Millisecond, Min: time.Millisecond, Max: 10 * time.Millisecond}
	if s != want {
		t.Fatalf("summarize = %+v, want %+v", s, want)
	}
	if one := summarize(durations(4)); one.Median != 4*time.Millisecond || one.P90 != 4*time.Millisecond {
		t.Fatalf("one sample: %+v", one)
	}
	if (summarize(nil) != Summary{}) {
		t.Fatal("empty input must give a zero Summary")
	}
}

func TestSummarizeDoesNotReorderInput(t *testing.T) {
	in := durations(3, 1, 2)
	summarize(in)
	if in[0] != 3*time.Millisecond {
		t.Fatalf("input was sorted in place: %v", in)
	}
}

func TestTimeNCountsOnlyTimedRuns(t *testing.T) {
	calls, afters := 0, 0
	got, err := timeN(context.Background(), 5, 2, func(int) error { calls++; return nil }, func(int) error { afters++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || calls != 7 || afters != 7 {
		t.Fatalf("samples=%d calls=%d afters=%d, want 5, 7, 7", len(got), calls, afters)
	}
}

func TestTimeNStopsOnErrorAndCancel(t *testing.T) {
	boom := errors.New("boom")
	if _, err := timeN(context.Background(), 5, 0, func(i int) error {
		if i == 2 {
			return boom
		}
		return nil
	}, nil); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := timeN(ctx, 5, 0, func(int) error { return nil }, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestMs(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1500 * time.Microsecond:  "1.50 ms",
		12340 * time.Microsecond: "12.3 ms",
		150 * time.Millisecond:   "150 ms",
	} {
		if got := ms(d); got != want {
			t.Errorf("ms(%v) = %q, want %q", d, got, want)
		}
	}
}
