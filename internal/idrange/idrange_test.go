package idrange

import (
	"errors"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestNewRefusesRangesWithoutASandboxSlot(t *testing.T) {
	for _, c := range []struct{ base, size uint32 }{
		{100000, 65536},            // the canonical slot only
		{100000, 65536*2 - 1},      // not two whole slots
		{0, 65536 * 4},             // host root
		{1<<32 - 65536, 65536 * 4}, // overflow
	} {
		if _, err := New(c.base, c.size); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(%d, %d) = %v, want invalid argument", c.base, c.size, err)
		}
	}
}

func TestAllocDistinctLowestFirstAndExhaustion(t *testing.T) {
	a, err := New(100000, 65536*4) // canonical + 3 sandbox slots
	if err != nil {
		t.Fatal(err)
	}
	if c := a.Canonical(); c != (IDMap{HostID: 100000, Size: 65536}) {
		t.Fatalf("canonical %+v", c)
	}
	var got []IDMap
	for range 3 {
		r, err := a.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	want := []IDMap{{HostID: 165536, Size: 65536}, {HostID: 231072, Size: 65536}, {HostID: 296608, Size: 65536}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("slot %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := a.Alloc(); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("fourth Alloc = %v, want resource exhausted", err)
	}
	a.Release(got[1])
	a.Release(got[1]) // twice: no effect
	a.Release(a.Canonical())
	if r, err := a.Alloc(); err != nil || r != got[1] {
		t.Fatalf("Alloc after Release = %+v, %v; want %+v", r, err, got[1])
	}
	if a.InUse() != 3 {
		t.Fatalf("InUse %d", a.InUse())
	}
}

func TestAdopt(t *testing.T) {
	a, err := New(100000, 65536*4)
	if err != nil {
		t.Fatal(err)
	}
	s2 := IDMap{HostID: 100000 + 2*65536, Size: 65536}
	if err := a.Adopt(s2); err != nil {
		t.Fatal(err)
	}
	if err := a.Adopt(s2); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Adopt = %v", err)
	}
	for _, bad := range []IDMap{a.Canonical(), {HostID: 100001, Size: 65536}, {HostID: 165536, Size: 100}, {HostID: 100000 + 4*65536, Size: 65536}, {HostID: 5, Size: 65536}} {
		if err := a.Adopt(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Adopt(%+v) = %v, want invalid argument", bad, err)
		}
	}
	// Alloc skips the adopted slot.
	for _, want := range []uint32{165536, 100000 + 3*65536} {
		r, err := a.Alloc()
		if err != nil || r.HostID != want {
			t.Fatalf("Alloc = %+v, %v; want host id %d", r, err, want)
		}
	}
}

func TestConcurrentAllocNeverShares(t *testing.T) {
	a, err := New(100000, 65536*65)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[uint32]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				r, err := a.Alloc()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[r.HostID] {
					t.Errorf("slot %d handed out twice", r.HostID)
				}
				seen[r.HostID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != 64 || a.InUse() != 64 {
		t.Fatalf("%d distinct slots, %d in use", len(seen), a.InUse())
	}
}
