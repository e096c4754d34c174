package templates

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/validate"
)

// Adopt registers an existing layer chain (for example an imported OCI
// image) as the built template name, with env as its sandboxes' default
// environment. A builtin name is refused (errdefs.ErrAlreadyExists); an
// earlier template of that name is replaced and its layers are released
// (sandboxes running on them keep them). The template has no build spec:
// rebuilding it is not possible, and templates cannot be based on it by
// name.
func (m *Manager) Adopt(ctx context.Context, name, layer string, env map[string]string) (Template, error) {
	if !nameRE.MatchString(name) {
		return Template{}, fmt.Errorf("template name %q: want [a-z0-9][a-z0-9._-]{0,62}: %w", name, errdefs.ErrInvalidArgument)
	}
	if _, ok := builtin(name); ok {
		return Template{}, fmt.Errorf("template %s is builtin: %w", name, errdefs.ErrAlreadyExists)
	}
	if err := validate.Environ(env); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	l, err := m.cfg.Layers.Get(layer)
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	r := record{Name: name, Key: "adopted:" + l.ID, Layer: l.ID, Env: maps.Clone(env), Spec: api.TemplateSpec{Name: name}, CreatedAt: time.Now().UTC()}
	if err := m.saveRecord(ctx, r); err != nil {
		return Template{}, err
	}
	return m.resolve(r)
}
