package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// Concurrent puts and deletes all land, and a write that fails fails alone.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	b, _ := openTemp(t)
	const n = 64
	for i := range n / 2 { // to be deleted concurrently below
		if err := b.PutSandbox(ctx, record(fmt.Sprintf("old%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				errs[i] = b.PutSandbox(ctx, record(fmt.Sprintf("new%02d", i)))
			} else {
				errs[i] = b.DeleteSandbox(ctx, fmt.Sprintf("old%02d", i/2))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[n] = b.group.update(func(*bolt.Tx) error { return boom })
	}()
	wg.Wait()
	for i, err := range errs[:n] {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if !errors.Is(errs[n], boom) {
		t.Errorf("failing write: got %v, want boom", errs[n])
	}
	recs, err := b.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n/2 {
		t.Errorf("%d records after the concurrent writes, want %d", len(recs), n/2)
	}
	for _, r := range recs {
		if r.Sandbox.ID[:3] != "new" {
			t.Errorf("record %s should have been deleted", r.Sandbox.ID)
		}
	}
}
