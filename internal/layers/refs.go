package layers

import (
	"context"
	"slices"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// RefAll is Ref for several owners of one layer with a single metadata
// write (forking N sandboxes from one checkpoint costs one synced write,
// not N). Idempotent.
func (s *Store) RefAll(ctx context.Context, id string, owners []string) error {
	return s.updateRefs(id, func(refs []string) []string {
		for _, o := range owners {
			if !slices.Contains(refs, o) {
				refs = append(refs, o)
			}
		}
		slices.Sort(refs)
		return refs
	})
}

// UnrefAll is Unref for several owners with a single metadata write. A
// missing layer is not an error.
func (s *Store) UnrefAll(ctx context.Context, id string, owners []string) error {
	err := s.updateRefs(id, func(refs []string) []string {
		return slices.DeleteFunc(refs, func(r string) bool { return slices.Contains(owners, r) })
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
