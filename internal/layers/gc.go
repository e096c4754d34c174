package layers

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// GCOptions are options of GC.
type GCOptions struct {
	// Roots are IDs of layers in use that need not hold a reference, for
	// example the top layers sandboxes run on. Unknown IDs are ignored.
	Roots []string
	// MinAge spares layers created or looked up (Get, Chain, Paths, ...)
	// less than MinAge ago in this process: a caller may be between
	// creating a layer and referencing it, or between resolving a cached
	// build step and stacking on it.
	MinAge time.Duration
}

// GCResult reports what GC did.
type GCResult struct {
	Removed    []string // IDs of the removed layers
	FreedBytes int64    // their Size
	Kept       int      // layers left
}

// GC removes every layer that is not in use: a layer is kept when it holds
// a reference (Ref), is one of opts.Roots, is younger than opts.MinAge, or
// lies below a kept layer in its chain (mark); every other layer is
// removed, the top of a chain first (sweep).
//
// Safety: the decision to remove a layer is re-checked under the store's
// lock at the moment of removal, so a layer referenced, stacked on or looked
// up while GC runs is never removed. Each removal is crash-safe (see
// Remove): after a crash, a layer is either listed and whole, or gone.
func (s *Store) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	start := time.Now()
	cutoff := start.Add(-opts.MinAge)
	young := func(l *Layer) bool { return l.CreatedAt.After(cutoff) || l.used.After(cutoff) }

	s.mu.Lock()
	keep := map[string]bool{}
	mark := func(id string) {
		for id != "" && !keep[id] {
			l, ok := s.layers[id]
			if !ok {
				return
			}
			keep[id] = true
			id = l.Parent
		}
	}
	for id, l := range s.layers {
		if len(l.Refs) > 0 || young(l) {
			mark(id)
		}
	}
	for _, r := range opts.Roots {
		if l, ok := s.layers[r]; ok {
			mark(l.ID)
		}
	}
	// Sweep candidates, deepest first so that children go before parents.
	depth := map[string]int{}
	var depthOf func(id string) int
	depthOf = func(id string) int {
		if d, ok := depth[id]; ok {
			return d
		}
		l, ok := s.layers[id]
		if !ok {
			return 0
		}
		d := 1 + depthOf(l.Parent)
		depth[id] = d
		return d
	}
	var sweep []string
	for id := range s.layers {
		if !keep[id] {
			sweep = append(sweep, id)
			depthOf(id)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(sweep, func(a, b string) int { return depth[b] - depth[a] })

	var res GCResult
	for _, id := range sweep {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var size int64
		err := s.remove(ctx, id, func(l *Layer) error {
			if young(l) {
				return fmt.Errorf("layer %s was used during GC: %w", id, errdefs.ErrConflict)
			}
			size = l.Size
			return nil
		})
		switch {
		case err == nil:
			res.Removed = append(res.Removed, id)
			res.FreedBytes += size
		case errdefs.IsConflict(err) || errdefs.IsNotFound(err):
			// In use again, or removed meanwhile: not garbage any more.
		default:
			return res, fmt.Errorf("collecting layers: %w", err)
		}
	}
	s.mu.Lock()
	res.Kept = len(s.layers)
	s.mu.Unlock()
	if len(res.Removed) > 0 {
		s.log.Info("layers collected", "removed", len(res.Removed), "freed_bytes", res.FreedBytes, "kept", res.Kept, "ms", time.Since(start).Milliseconds())
	}
	return res, nil
}
