package snapshot

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Retention of implicit checkpoints.
//
// The checkpoints the daemon takes on its own (exec --checkpoint, fork of
// a sandbox, merge: label agentbox.implicit) would otherwise pile up and
// count against their tenant's disk quota. Per sandbox, the newest
// Retention.Keep are kept and any older than Retention.MaxAge goes. They
// are pruned when a new one of the same sandbox is taken, and by a timer
// (StartPruning) for their age. Never pruned: a checkpoint a live sandbox
// was forked from (its merge base), one a live sandbox runs on (forked or
// restored: DeleteCheckpoint refuses it), and one an operation in flight
// needs (a transaction's, until its rollback is decided; a fork's or
// merge's, until it is done: pin). Checkpoints users ask for are never
// pruned. The API shows which checkpoints are implicit and when they
// expire (api.Checkpoint.Implicit, ExpiresAt).

// Retention bounds the implicit checkpoints of each sandbox.
type Retention struct {
	// Keep is how many are kept per sandbox, newest first; 0: no limit.
	Keep int
	// MaxAge prunes one once it is that old; 0: no limit.
	MaxAge time.Duration
}

func (r Retention) limited() bool { return r.Keep > 0 || r.MaxAge > 0 }

// pruner is the pruning state of Snapshots.
type pruner struct {
	// mu guards the fields below.
	mu      sync.Mutex
	pinned  map[string]int // checkpoint id -> operations in flight that need it
	started bool
	closed  bool

	stop chan struct{} // closed by Close
	done sync.WaitGroup
}

// pin keeps checkpoint cid from being pruned until unpin is called (once).
func (m *Snapshots) pin(cid string) (unpin func()) {
	p := &m.prune
	p.mu.Lock()
	p.pinned[cid]++
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.pinned[cid]--; p.pinned[cid] <= 0 {
				delete(p.pinned, cid)
			}
			p.mu.Unlock()
		})
	}
}

func (m *Snapshots) isPinned(cid string) bool {
	m.prune.mu.Lock()
	defer m.prune.mu.Unlock()
	return m.prune.pinned[cid] > 0
}

// describe fills in what the API shows of c's retention.
func (m *Snapshots) describe(c *api.Checkpoint) {
	c.Implicit = c.Labels[LabelImplicit]
	c.ExpiresAt = nil
	if c.Implicit != "" && m.ret.MaxAge > 0 {
		t := c.CreatedAt.Add(m.ret.MaxAge)
		c.ExpiresAt = &t
	}
}

// pruneInterval is how often the timer looks for expired checkpoints: a
// tenth of the age limit, between a second and ten minutes.
func (r Retention) pruneInterval() time.Duration {
	return min(max(r.MaxAge/10, time.Second), 10*time.Minute)
}

// StartPruning prunes every sandbox's implicit checkpoints now (the
// retention may have been lowered since they were taken) and, with an age
// limit, again on a timer until Close. Call it once the core has recovered
// its sandboxes (a fork not yet re-adopted would not protect its base);
// a second call does nothing.
func (m *Snapshots) StartPruning(ctx context.Context) {
	p := &m.prune
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed || !m.ret.limited() {
		return
	}
	p.started = true
	ctx = context.WithoutCancel(ctx)
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		m.PruneImplicit(ctx, "")
		if m.ret.MaxAge <= 0 {
			return
		}
		t := time.NewTicker(m.ret.pruneInterval())
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				m.PruneImplicit(ctx, "")
			}
		}
	}()
}

// Close implements io.Closer: it stops the pruning timer and waits for a
// prune under way. Closing again does nothing.
func (m *Snapshots) Close() error {
	p := &m.prune
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.done.Wait()
	return nil
}

// PruneImplicit deletes the implicit checkpoints of sandbox id ("" for
// every sandbox) that the retention no longer keeps, and returns how many
// it deleted. It acts as the daemon (every tenant's checkpoints); failures
// are logged, never returned: what is left is tried again next time.
func (m *Snapshots) PruneImplicit(ctx context.Context, id string) int {
	cs, _, err := m.checkpoints()
	if err != nil || !m.ret.limited() {
		return 0
	}
	ctx = tenant.WithPrincipal(context.WithoutCancel(ctx), tenant.Admin)
	recs, err := cs.ListCheckpoints(ctx)
	if err != nil {
		m.log.WarnContext(ctx, "pruning implicit checkpoints: listing checkpoints", "err", err)
		return 0
	}
	bySandbox := map[string][]store.CheckpointRecord{}
	for _, r := range recs {
		if r.Checkpoint.Labels[LabelImplicit] != "" && (id == "" || r.Checkpoint.SandboxID == id) {
			bySandbox[r.Checkpoint.SandboxID] = append(bySandbox[r.Checkpoint.SandboxID], r)
		}
	}
	if len(bySandbox) == 0 {
		return 0
	}
	bases, err := m.forkBases(ctx)
	if err != nil {
		m.log.WarnContext(ctx, "pruning implicit checkpoints: listing sandboxes", "err", err)
		return 0
	}
	now := time.Now()
	pruned := 0
	for _, group := range bySandbox {
		// Newest first.
		slices.SortFunc(group, func(a, b store.CheckpointRecord) int {
			if c := b.Checkpoint.CreatedAt.Compare(a.Checkpoint.CreatedAt); c != 0 {
				return c
			}
			return strings.Compare(b.Checkpoint.ID, a.Checkpoint.ID)
		})
		for i, r := range group {
			c := r.Checkpoint
			expired := m.ret.MaxAge > 0 && now.Sub(c.CreatedAt) >= m.ret.MaxAge
			over := m.ret.Keep > 0 && i >= m.ret.Keep
			if !expired && !over || bases[c.ID] || m.isPinned(c.ID) {
				continue
			}
			err := m.DeleteCheckpoint(ctx, c.ID)
			switch {
			case err == nil:
				pruned++
				m.log.InfoContext(ctx, "implicit checkpoint pruned", "checkpoint", c.ID, "sandbox", c.SandboxID,
					"implicit", c.Labels[LabelImplicit], "expired", expired)
			case errdefs.IsConflict(err) || errdefs.IsNotFound(err):
				// A sandbox runs on it, or it went meanwhile.
			default:
				m.log.WarnContext(ctx, "pruning implicit checkpoint", "checkpoint", c.ID, "err", err)
			}
		}
	}
	return pruned
}

// forkBases returns the checkpoints live sandboxes were forked from: the
// merge bases that must stay.
func (m *Snapshots) forkBases(ctx context.Context) (map[string]bool, error) {
	sbs, err := m.sbx.ListSandboxes(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, sb := range sbs {
		h, err := m.sbx.Handle(ctx, sb.ID)
		if err != nil {
			continue // deleted meanwhile
		}
		if b := h.ForkBase(); b != "" {
			out[b] = true
		}
	}
	return out, nil
}
