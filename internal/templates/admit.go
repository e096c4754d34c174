package templates

import (
	"context"
	"fmt"
	"strings"
)

// Layer references of templates. A built or imported template holds one
// on its top layer as "template/NAME", each version of a saved template
// one on its own as "template/NAME@N" (NAME is the stored name, which
// carries the owning tenant; internal/tenant.Qualify).
const refPrefix = "template/"

func builtRef(name string) string          { return refPrefix + name }
func versionRef(name string, v int) string { return fmt.Sprintf("%s%s@%d", refPrefix, name, v) }

// RefTemplate returns the stored name of the template that holds a layer
// reference of owner ref, and false when ref is not a template's.
func RefTemplate(ref string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(ref, refPrefix)
	if !ok || rest == "" {
		return "", false
	}
	name, _, _ = strings.Cut(rest, "@")
	return name, true
}

// admit asks Config.Admit whether template name may take layer.
func (m *Manager) admit(ctx context.Context, name, layer string) (release func(), err error) {
	if m.cfg.Admit == nil {
		return func() {}, nil
	}
	return m.cfg.Admit(ctx, name, layer)
}
