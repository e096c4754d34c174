package store

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit runs small independent writes (one record each) in shared
// transactions: a write that arrives while a commit is on disk waits for
// it, then goes out with every other write that arrived meanwhile, in one
// transaction and so one pair of fsyncs. A write that finds no commit
// running starts one at once, so nothing waits for a timer (unlike bbolt's
// Batch, which delays every write by up to its MaxBatchDelay).
//
// Under concurrency (sixteen sandboxes created at once) the fsyncs, not
// the writes, bound how many records a second bbolt can store; a group
// commit pays them once per group instead of once per record.
type groupCommit struct {
	db *bolt.DB

	// mu guards the fields below.
	mu      sync.Mutex
	pending []*groupWrite
	leading bool // a caller is committing groups
}

type groupWrite struct {
	fn   func(*bolt.Tx) error
	err  error
	done chan struct{}
}

// update runs fn in a write transaction shared with other update calls
// and returns fn's error, or the commit's. fn must touch only what no
// concurrent fn touches (its own key), must not retain tx, and runs once.
// A failing fn fails alone: the others still commit.
func (g *groupCommit) update(fn func(*bolt.Tx) error) error {
	w := &groupWrite{fn: fn, done: make(chan struct{})}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	if g.leading {
		g.mu.Unlock()
		<-w.done // the leader commits it with the next group
		return w.err
	}
	g.leading = true
	for len(g.pending) > 0 {
		group := g.pending
		g.pending = nil
		g.mu.Unlock()
		g.commit(group)
		g.mu.Lock()
	}
	g.leading = false
	g.mu.Unlock()
	<-w.done
	return w.err
}

// commit applies group in one transaction and reports to each write.
func (g *groupCommit) commit(group []*groupWrite) {
	err := g.db.Update(func(tx *bolt.Tx) error {
		for _, w := range group {
			w.err = w.fn(tx)
		}
		return nil
	})
	for _, w := range group {
		if err != nil && w.err == nil {
			w.err = err
		}
		close(w.done)
	}
}
