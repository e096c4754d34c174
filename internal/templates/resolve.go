package templates

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Store is the part of a template store Resolve needs; *Manager
// implements it.
type Store interface {
	Get(ctx context.Context, name string) (Template, error)
	Build(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (Template, error)
}

var _ Store = (*Manager)(nil)

// Resolve returns the first of candidates (full stored names, in the
// order a caller looks them up: a tenant's own, then the catalogue's)
// that st holds; when it holds none and name is a builtin template, the
// builtin is built on first use, its steps logged to log. Otherwise the
// error is ErrNotFound. A failure other than not-found is returned at
// once.
func Resolve(ctx context.Context, st Store, candidates []string, name string, log *slog.Logger) (Template, error) {
	for _, q := range candidates {
		t, err := st.Get(ctx, q)
		if err == nil || !errdefs.IsNotFound(err) {
			return t, err
		}
	}
	if _, ok := BuiltinSpec(name); !ok {
		return Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	log.InfoContext(ctx, "building template on first use", "template", name)
	return st.Build(ctx, api.BuildTemplateRequest{Name: name}, func(ev api.BuildEvent) {
		if ev.Type == api.BuildEventStep {
			log.InfoContext(ctx, "template build", "template", name, "step", ev.Message)
		}
	})
}

// SpecOf returns the spec of the first of candidates (as for Resolve)
// that st holds, else name's builtin spec, without building anything;
// false when there is neither.
func SpecOf(ctx context.Context, st Store, candidates []string, name string) (api.TemplateSpec, bool) {
	for _, q := range candidates {
		if t, err := st.Get(ctx, q); err == nil {
			return t.Spec, true
		}
	}
	return BuiltinSpec(name)
}
