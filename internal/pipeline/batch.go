package pipeline

import (
	"context"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/store"
)

// runBatchDelay is how long a finished run record waits for others to
// share its commit. Records are written off the exec path (readers see
// them in memory meanwhile), so the wait costs no caller anything, while
// back-to-back execs would otherwise pay a commit (two fsyncs) each: at a
// thousand execs a second that was a quarter of the daemon's CPU.
const runBatchDelay = 5 * time.Millisecond

// runBatcher writes run records in batches: the first record of a batch
// schedules a commit runBatchDelay later, and every record that arrives
// before it goes out in the same store.PutRuns. Safe for concurrent use.
type runBatcher struct {
	st    store.PipelineStore
	delay time.Duration

	// mu guards the fields below.
	mu        sync.Mutex
	pending   []*runWrite
	scheduled bool // a commit of pending is scheduled
}

type runWrite struct {
	run  api.Run
	err  error
	done chan struct{}
}

// put stores run and returns once its batch is committed (or failed).
func (b *runBatcher) put(run api.Run) error {
	w := &runWrite{run: run, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, w)
	if !b.scheduled {
		b.scheduled = true
		time.AfterFunc(b.delay, b.commit)
	}
	b.mu.Unlock()
	<-w.done
	return w.err
}

// commit writes what is pending in one store call and reports to each.
func (b *runBatcher) commit() {
	b.mu.Lock()
	batch := b.pending
	b.pending, b.scheduled = nil, false
	b.mu.Unlock()
	runs := make([]api.Run, len(batch))
	for i, w := range batch {
		runs[i] = w.run
	}
	err := b.st.PutRuns(context.Background(), runs)
	for _, w := range batch {
		w.err = err
		close(w.done)
	}
}
