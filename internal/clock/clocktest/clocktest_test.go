package clocktest

import (
	"slices"
	"testing"
	"time"
)

func TestFakeRunsDueTimersInOrder(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewFake(t0)
	var got []string
	var at []time.Duration
	note := func(name string) func() {
		return func() { got = append(got, name); at = append(at, c.Now().Sub(t0)) }
	}
	c.AfterFunc(3*time.Second, note("c"))
	c.AfterFunc(time.Second, func() {
		note("a")()
		c.AfterFunc(time.Second, note("b")) // armed by a callback, due within the same Advance
	})
	stopped := c.AfterFunc(2*time.Second, note("stopped"))
	c.AfterFunc(time.Minute, note("late"))
	if !stopped.Stop() || stopped.Stop() {
		t.Error("Stop reports true once, then false")
	}
	c.Advance(5 * time.Second)
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("ran %v, want %v", got, want)
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}; !slices.Equal(at, want) {
		t.Errorf("ran at %v, want %v", at, want)
	}
	if d := c.Now().Sub(t0); d != 5*time.Second {
		t.Errorf("now is t0+%v, want +5s", d)
	}
	c.Advance(time.Minute)
	if got[len(got)-1] != "late" {
		t.Errorf("ran %v, want late last", got)
	}
}
