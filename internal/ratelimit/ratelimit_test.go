package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestPerKeyBurstThenRefuses(t *testing.T) {
	p := New(2, 5)
	for i := range 5 {
		if _, ok := p.Allow("a"); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	d, ok := p.Allow("a")
	if ok || d <= 0 || d > time.Second {
		t.Fatalf("request over the burst: ok %v retry after %v, want refused within 0.5s", ok, d)
	}
	// Refused requests take no token: the wait does not grow.
	for range 100 {
		p.Allow("a")
	}
	if d2, _ := p.Allow("a"); d2 > d+50*time.Millisecond {
		t.Fatalf("refusals consumed tokens: wait grew from %v to %v", d, d2)
	}
	// Another key has its own bucket.
	if _, ok := p.Allow("b"); !ok {
		t.Fatal("another key refused")
	}
	time.Sleep(d + 10*time.Millisecond)
	if _, ok := p.Allow("a"); !ok {
		t.Fatal("refused after the advertised wait")
	}
}

func TestPerKeyUnlimited(t *testing.T) {
	p := New(0, 0)
	for range 1000 {
		if _, ok := p.Allow("a"); !ok {
			t.Fatal("refused without a rate")
		}
	}
}

func TestPerKeyPrunesFullBuckets(t *testing.T) {
	p := New(1000, 1)
	for i := range maxIdleKeys {
		p.Allow(fmt.Sprint(i))
	}
	time.Sleep(5 * time.Millisecond) // every bucket refills
	p.Allow("new")
	if n := len(p.buckets); n > 20 {
		t.Fatalf("%d buckets kept after pruning", n)
	}
}
