package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Registry is the set of backends a daemon runs sandboxes on, by name
// (Capabilities().Name), one of them the default. The daemon, the
// composition root, builds it once; it never changes afterwards, so it is
// safe for concurrent use without locking.
//
// A sandbox runs on one backend for its whole life: the backend it was
// created on is recorded with it (api.Sandbox.Backend) and every later
// operation, a restarted daemon's Recover included, goes to that backend.
type Registry struct {
	def    string
	byName map[string]Backend
	order  []Backend // registration order
	// unavailable holds, by name, why a backend the daemon knows could
	// not start on this host (MarkUnavailable).
	unavailable map[string]error
}

// NewRegistry returns the registry of backends whose default is the one
// called def ("": the first of backends). It fails with
// errdefs.ErrInvalidArgument when backends is empty, when a name is not
// valid (ValidName) or taken twice, or when def names none of them. The
// registry owns the backends from then on: Close closes them.
func NewRegistry(def string, backends ...Backend) (*Registry, error) {
	if len(backends) == 0 {
		return nil, fmt.Errorf("backend registry: no backend: %w", errdefs.ErrInvalidArgument)
	}
	r := &Registry{byName: make(map[string]Backend, len(backends))}
	for _, b := range backends {
		name := b.Capabilities().Name
		if !ValidName(name) {
			return nil, fmt.Errorf("backend registry: backend name %q is not valid: %w", name, errdefs.ErrInvalidArgument)
		}
		if _, dup := r.byName[name]; dup {
			return nil, fmt.Errorf("backend registry: backend %q registered twice: %w", name, errdefs.ErrInvalidArgument)
		}
		r.byName[name] = b
		r.order = append(r.order, b)
	}
	if def == "" {
		def = r.order[0].Capabilities().Name
	}
	if _, ok := r.byName[def]; !ok {
		return nil, fmt.Errorf("runtime %q: %w", def, r.unknown())
	}
	r.def = def
	return r, nil
}

// MarkUnavailable records that the backend called name is one the daemon
// knows but could not start on this host, for reason (e.g. gvisor without
// runsc): a Lookup of it then fails with that reason (wrapped in
// errdefs.ErrFailedPrecondition unless it carries a category of its own)
// instead of "no such backend", and Unavailable lists it. Call it only
// while building the registry, before it is shared; a name that runs is
// left as it is.
func (r *Registry) MarkUnavailable(name string, reason error) {
	if _, ok := r.byName[name]; ok || reason == nil {
		return
	}
	if r.unavailable == nil {
		r.unavailable = map[string]error{}
	}
	if errdefs.Code(reason) == "internal" { // no category of its own
		reason = fmt.Errorf("%w: %w", reason, errdefs.ErrFailedPrecondition)
	}
	r.unavailable[name] = reason
}

// Unavailable returns the backends marked unavailable, by name, with why.
func (r *Registry) Unavailable() map[string]error {
	out := make(map[string]error, len(r.unavailable))
	for k, v := range r.unavailable {
		out[k] = v
	}
	return out
}

// ValidName reports whether name can name a backend: 1 to 32 lower-case
// letters, digits and dashes, starting with a letter or digit.
func ValidName(name string) bool {
	if name == "" || len(name) > 32 || name[0] == '-' {
		return false
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Lookup returns the backend called name; "" is the default. An unknown
// name fails with errdefs.ErrInvalidArgument (names come from requests and
// the configuration), the message listing the backends there are; a
// backend marked unavailable fails with its reason (MarkUnavailable).
func (r *Registry) Lookup(name string) (Backend, error) {
	if name == "" {
		name = r.def
	}
	if b, ok := r.byName[name]; ok {
		return b, nil
	}
	if reason, ok := r.unavailable[name]; ok {
		return nil, fmt.Errorf("runtime %q is not available on this host: %w", name, reason)
	}
	return nil, fmt.Errorf("runtime %q: %w", name, r.unknown())
}

func (r *Registry) unknown() error {
	return fmt.Errorf("no such backend (this daemon runs %s): %w", strings.Join(r.Names(), ", "), errdefs.ErrInvalidArgument)
}

// Default returns the backend of sandboxes whose create names none.
func (r *Registry) Default() Backend { return r.byName[r.def] }

// DefaultName is the default backend's name.
func (r *Registry) DefaultName() string { return r.def }

// Names returns the backends' names, the default first, the others in
// registration order.
func (r *Registry) Names() []string {
	out := make([]string, 0, len(r.order))
	for _, b := range r.All() {
		out = append(out, b.Capabilities().Name)
	}
	return out
}

// All returns the backends, the default first, the others in registration
// order.
func (r *Registry) All() []Backend {
	out := make([]Backend, 0, len(r.order))
	if d, ok := r.byName[r.def]; ok { // not yet while NewRegistry checks def
		out = append(out, d)
	}
	for _, b := range r.order {
		if b.Capabilities().Name != r.def {
			out = append(out, b)
		}
	}
	return out
}

// FillPools tells every backend that implements Prespawner that it may
// start guests ahead of need (see Prespawner for when).
func (r *Registry) FillPools() {
	for _, b := range r.order {
		if p, ok := b.(Prespawner); ok {
			p.FillPool()
		}
	}
}

// SweepOrphans runs every Sweeper backend's sweep with keep and returns
// the ids they removed, joining their errors (each sweep runs, whatever
// the others did).
func (r *Registry) SweepOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	var (
		swept []string
		errs  []error
	)
	for _, b := range r.order {
		s, ok := b.(Sweeper)
		if !ok {
			continue
		}
		ids, err := s.SweepOrphans(ctx, keep)
		swept = append(swept, ids...)
		if err != nil {
			errs = append(errs, fmt.Errorf("backend %s: %w", b.Capabilities().Name, err))
		}
	}
	return swept, errors.Join(errs...)
}

// Close closes every backend that implements Closer, the last registered
// first, and returns their errors joined. Sandboxes keep running. Call it
// once, after the last use of any backend.
func (r *Registry) Close() error {
	var errs []error
	for i := len(r.order) - 1; i >= 0; i-- {
		if c, ok := r.order[i].(Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing backend %s: %w", r.order[i].Capabilities().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
