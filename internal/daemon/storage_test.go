package daemon

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A trigger during a collection makes exactly one more after it, however
// many come; a trigger with none running starts one.
func TestCollectorCoalesces(t *testing.T) {
	var runs atomic.Int32
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	c := &collector{collect: func(context.Context) error {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return nil
	}}
	c.trigger()
	<-started
	for range 5 {
		c.trigger() // during the run
	}
	release <- struct{}{}
	select {
	case <-started: // the one more run
	case <-time.After(5 * time.Second):
		t.Fatal("no run after triggers during a run")
	}
	release <- struct{}{}
	waitIdle(t, c)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs; want 2", n)
	}
	c.trigger()
	<-started
	release <- struct{}{}
	waitIdle(t, c)
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs after an idle trigger; want 3", n)
	}
}

func waitIdle(t *testing.T, c *collector) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("collector still running")
		}
		time.Sleep(time.Millisecond)
	}
}
