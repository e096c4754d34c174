package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/store"
)

// countingStore counts PutRuns calls and can fail them.
type countingStore struct {
	store.PipelineStore
	mu    sync.Mutex
	calls int
	fail  error
}

func (c *countingStore) PutRuns(ctx context.Context, runs []api.Run) error {
	c.mu.Lock()
	c.calls++
	fail := c.fail
	c.mu.Unlock()
	if fail != nil {
		return fail
	}
	return c.PipelineStore.PutRuns(ctx, runs)
}

// Records finished together share one commit; each put returns once its
// record is stored; a failed commit fails every record of its batch.
func TestRunBatcher(t *testing.T) {
	st, err := store.Open(t.TempDir() + "/meta.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cs := &countingStore{PipelineStore: st}
	b := &runBatcher{st: cs, delay: 20 * time.Millisecond}

	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("run_%04d", i)
			if err := b.put(api.Run{ID: id, State: api.RunFinished}); err != nil {
				t.Error(err)
				return
			}
			if _, err := st.GetRun(context.Background(), id); err != nil {
				t.Errorf("put returned before %s was stored: %v", id, err)
			}
		}()
	}
	wg.Wait()
	if cs.calls < 1 || cs.calls > 3 {
		t.Fatalf("%d records written in %d commits, want them batched", n, cs.calls)
	}

	cs.fail = errors.New("disk full")
	errs := make(chan error, 2)
	for i := range 2 {
		go func() { errs <- b.put(api.Run{ID: fmt.Sprintf("run_x%d", i)}) }()
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, cs.fail) {
			t.Fatalf("put in a failed batch: %v", err)
		}
	}
}
