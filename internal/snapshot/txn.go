package snapshot

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/layers"
)

// Exec transactions: an exec with checkpoint_before takes a checkpoint
// (labelled agentbox.implicit=exec) before the command starts; with
// rollback_on_failure the sandbox's files are put back to it when the
// command exits non-zero, is killed by a signal or times out. The rollback
// happens before the exit event is delivered, so a client that sees the
// event sees the rolled-back files; the event carries the checkpoint id
// and rolled_back.
//
// The rollback is not a restore: a restore restarts the guest, which would
// kill every process of the sandbox, a server the transaction did not
// start included. Instead the changes since the checkpoint are reverted
// through the running guest (revert), as a merge applies changes: paths
// created since are removed, and what was changed or removed is written
// back from the checkpoint's immutable layers (content, type, mode,
// owner, modification time; symlinks as links). Nothing writes into the
// upper directory under the live overlay. Processes keep running, those
// the command left behind too; one holding a reverted file open keeps
// reading what its descriptor points at. Device nodes, fifos and sockets
// are not recreated, and hard links come back as copies. Writes by other
// processes while the rollback runs may land before or after it. When the
// guest cannot apply the revert, the transaction falls back to a restore
// (which restarts the guest) rather than leave files half reverted, and
// logs why.
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
		err := m.revert(rctx, id, ck.ID)
		if err == nil {
			ev.RolledBack = true
			return
		}
		m.log.WarnContext(rctx, "reverting files through the guest failed; restoring the checkpoint (this restarts the guest)",
			"sandbox", id, "checkpoint", ck.ID, "err", err)
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

// revert puts sandbox id's files back to checkpoint cid through its
// running guest, leaving its processes alone (see above). The plan is made
// with the sandbox's lock held shared (ReadFS); the changes are written
// after it is released, from the checkpoint's layers, which never change.
func (m *Snapshots) revert(ctx context.Context, id, cid string) error {
	ck, err := m.checkpointState(ctx, cid)
	if err != nil {
		return err
	}
	live, err := m.sandboxState(ctx, id)
	if err != nil {
		return err
	}
	changes, err := func() ([]layers.Change, error) {
		defer live.release()
		lv, err := m.view(ctx, live)
		if err != nil {
			return nil, err
		}
		cv, err := m.view(ctx, ck)
		if err != nil {
			return nil, err
		}
		return layers.Diff(ctx, lv, cv)
	}()
	if err != nil {
		return fmt.Errorf("planning the rollback of sandbox %s: %w", id, err)
	}
	if err := m.applyChanges(ctx, id, changes); err != nil {
		return fmt.Errorf("rolling back sandbox %s: %w", id, err)
	}
	m.log.InfoContext(ctx, "exec rolled back", "sandbox", id, "checkpoint", cid, "paths", len(changes))
	return nil
}
