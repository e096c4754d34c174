package snapshot

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// Exec transactions: an exec with checkpoint_before takes a checkpoint
// (labelled agentbox.implicit=exec) before the command starts; with
// rollback_on_failure the sandbox is restored to it when the command exits
// non-zero, is killed by a signal or times out. The restore happens before
// the exit event is delivered, so a client that sees the event sees the
// rolled-back sandbox; the event carries the checkpoint id and rolled_back.
//
// The transaction does not depend on the client: it follows the command to
// its end even when the stream is closed early, and rolls back then.

// Exec is the sandbox core's Exec (it runs req in sandbox id and streams
// its events) that also serves exec transactions: a request with
// CheckpointBefore or RollbackOnFailure is admitted, checkpointed, and
// passed on without them; any other request is passed on as it is.
func (m *Snapshots) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	if !req.CheckpointBefore && !req.RollbackOnFailure {
		return m.sbx.Exec(ctx, id, req)
	}
	if err := m.admitExec(ctx, id); err != nil {
		return nil, err
	}
	return m.execTransaction(ctx, id, req)
}

// execTransaction is Exec for requests with CheckpointBefore or
// RollbackOnFailure set.
func (m *Snapshots) execTransaction(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	rollback := req.RollbackOnFailure
	req.CheckpointBefore, req.RollbackOnFailure = false, false
	ck, err := m.CreateCheckpoint(ctx, id, api.CreateCheckpointRequest{
		Name:   "exec",
		Labels: map[string]string{LabelImplicit: "exec"},
	})
	if err != nil {
		return nil, err
	}
	// The checkpoint stays until the rollback is decided, whatever the
	// retention; older implicit ones of the sandbox may go now.
	unpin := m.pin(ck.ID)
	m.PruneImplicit(ctx, id)
	// The command must be followed to its end even if the client leaves.
	inner, err := m.sbx.Exec(context.WithoutCancel(ctx), id, req)
	if err != nil {
		unpin()
		return nil, err
	}
	t := &txnStream{events: make(chan txnItem, 64), done: make(chan struct{})}
	go t.pump(inner, unpin, func(ev *api.ExecEvent) {
		ev.Checkpoint = ck.ID
		if !rollback || !failed(*ev) {
			return
		}
		rctx := context.WithoutCancel(ctx)
		if _, err := m.Restore(rctx, id, ck.ID); err != nil {
			m.log.ErrorContext(rctx, "rolling back exec", "sandbox", id, "checkpoint", ck.ID, "err", err)
			return
		}
		ev.RolledBack = true
	})
	return t, nil
}

// failed reports whether an exit event ends a failed command.
func failed(ev api.ExecEvent) bool {
	return ev.TimedOut || ev.Signal != "" || ev.ExitCode == nil || *ev.ExitCode != 0
}

type txnItem struct {
	ev  api.ExecEvent
	err error
}

// txnStream forwards the events of an exec, running onExit on its exit
// event before delivering it.
type txnStream struct {
	events    chan txnItem
	done      chan struct{}
	closeOnce sync.Once
}

// pump forwards inner's events; done runs when inner ends.
func (t *txnStream) pump(inner execstream.Stream, done func(), onExit func(*api.ExecEvent)) {
	defer done()
	defer inner.Close()
	defer close(t.events)
	for {
		ev, err := inner.Next()
		if err != nil {
			t.send(txnItem{err: err})
			return
		}
		if ev.Type == api.EventExit {
			onExit(&ev)
		}
		t.send(txnItem{ev: ev})
		if ev.Type == api.EventExit || ev.Type == api.EventError {
			return
		}
	}
}

// send delivers it unless the stream was closed, in which case output is
// dropped while the command is still followed.
func (t *txnStream) send(it txnItem) {
	select {
	case t.events <- it:
	case <-t.done:
	}
}

// Next implements execstream.Stream.
func (t *txnStream) Next() (api.ExecEvent, error) {
	select {
	case it, ok := <-t.events:
		if !ok {
			return api.ExecEvent{}, io.EOF
		}
		return it.ev, it.err
	case <-t.done:
		return api.ExecEvent{}, fmt.Errorf("exec stream closed: %w", errdefs.ErrUnavailable)
	}
}

// Close implements execstream.Stream: it detaches; the transaction completes.
func (t *txnStream) Close() error {
	t.closeOnce.Do(func() { close(t.done) })
	return nil
}
