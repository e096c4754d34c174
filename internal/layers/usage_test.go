package layers

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestChainsSize(t *testing.T) {
	s := newStore(t)
	base := stack(t, s, []string{"bin/sh=" + strings.Repeat("b", 1<<16)})
	a := stack(t, s, []string{"bin/sh=" + strings.Repeat("b", 1<<16)}, []string{"a=" + strings.Repeat("a", 1<<17)})
	ab := stack(t, s, []string{"bin/sh=" + strings.Repeat("b", 1<<16)}, []string{"a=" + strings.Repeat("a", 1<<17)}, []string{"b=" + strings.Repeat("x", 1<<15)})
	c := stack(t, s, []string{"bin/sh=" + strings.Repeat("b", 1<<16)}, []string{"c=c"})
	for _, l := range []Layer{base, a, ab, c} {
		if l.Size <= 0 {
			t.Fatalf("layer %s has size %d", l.ID, l.Size)
		}
	}
	size := func(ls ...Layer) int64 {
		var n int64
		for _, l := range ls {
			n += l.Size
		}
		return n
	}
	for _, tc := range []struct {
		name           string
		roots, exclude []string
		want           int64
	}{
		{"nothing", nil, nil, 0},
		{"one chain", []string{a.ID}, nil, size(base, a)},
		{"shared layers once", []string{ab.ID, a.ID, c.ID, ab.ID}, nil, size(base, a, ab, c)},
		{"excluded chain", []string{ab.ID, c.ID}, []string{base.ID}, size(a, ab, c)},
		{"excluded chain above", []string{ab.ID}, []string{a.ID}, size(ab)},
		{"all excluded", []string{a.ID}, []string{ab.ID}, 0},
		{"unknown ids", []string{strings.Repeat("f", 64), c.ID}, []string{strings.Repeat("e", 64)}, size(base, c)},
	} {
		if got := s.ChainsSize(tc.roots, tc.exclude); got != tc.want {
			t.Errorf("%s: ChainsSize = %d, want %d", tc.name, got, tc.want)
		}
	}

	// Measuring is not a use: the layers stay collectable.
	time.Sleep(20 * time.Millisecond)
	s.ChainsSize([]string{ab.ID, c.ID}, nil)
	res, err := s.GC(context.Background(), GCOptions{MinAge: 10 * time.Millisecond})
	if err != nil || len(res.Removed) != 4 {
		t.Errorf("GC after ChainsSize removed %v, %v; want all 4 layers", res.Removed, err)
	}
}
