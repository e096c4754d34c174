package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.Sweeper = (*Backend)(nil)

// SweepOrphans implements runtime.Sweeper: every sandbox the backend's
// root holds (a bundle, or a container runsc knows) whose id keep rejects
// is cleaned up from its id alone (Cleanup: the container, its cgroup, the
// bundle's mounts and the bundle; its socket and state dir, which only the
// daemon's record names, are the daemon's). What a daemon that died
// mid-create left is found so. The root is the daemon's alone: it sits in
// its run directory, which one daemon holds at a time.
func (b *Backend) SweepOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	found := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(b.root, "b"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("gvisor sweep: %w", err)
	}
	for _, e := range ents {
		found[e.Name()] = true
	}
	out, err := b.runsc(ctx, "list", "--quiet")
	if err != nil {
		return nil, fmt.Errorf("gvisor sweep: %w", err)
	}
	for _, id := range strings.Fields(string(out)) {
		found[id] = true
	}
	var (
		swept []string
		errs  []error
	)
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range found {
			if !yield(id) {
				return
			}
		}
	}) {
		if keep(id) || !idPattern.MatchString(id) {
			continue
		}
		if err := b.Cleanup(ctx, runtime.Spec{ID: id}); err != nil {
			errs = append(errs, err)
			continue
		}
		swept = append(swept, id)
	}
	return swept, errors.Join(errs...)
}
