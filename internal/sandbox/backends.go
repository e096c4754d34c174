package sandbox

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Backends by sandbox. Every sandbox runs on the backend it was created
// on, named in its record (api.Sandbox.Backend); every operation on it,
// re-adoption included, goes to that backend (runtime.Registry). Build
// steps and forks of checkpoints, which name none, run on the default.

// legacyBackend is the backend of a record that names none: every
// sandbox before backends were chosen by configuration ran on it.
const legacyBackend = "native"

// backendName is the name of the backend rec's sandbox runs on: the one its
// record names; for a record that names none, native (the registry's
// default when this daemon runs no native backend).
func (m *Manager) backendName(rec store.SandboxRecord) string {
	if n := rec.Sandbox.Backend; n != "" {
		return n
	}
	if _, err := m.backends.Lookup(legacyBackend); err == nil {
		return legacyBackend
	}
	return m.backends.DefaultName()
}

// backendOf returns the backend rec's sandbox runs on; an error
// (errdefs.ErrInvalidArgument) when this daemon does not run it.
func (m *Manager) backendOf(rec store.SandboxRecord) (runtime.Backend, error) {
	b, err := m.backends.Lookup(m.backendName(rec))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", rec.Sandbox.ID, err)
	}
	return b, nil
}

// resolveRuntime replaces req.Runtime by the name of the backend it asks
// for ("": the default); errdefs.ErrInvalidArgument for one this daemon
// does not run.
func (m *Manager) resolveRuntime(req *api.CreateSandboxRequest) (runtime.Backend, error) {
	b, err := m.backends.Lookup(req.Runtime)
	if err != nil {
		return nil, err
	}
	req.Runtime = b.Capabilities().Name
	return b, nil
}

// templateRuntime is the backend the template called name (""; the
// default template) asks for its sandboxes (api.TemplateSpec.Runtime); ""
// when it asks for none or cannot be resolved (the create then reports
// why).
func (m *Manager) templateRuntime(ctx context.Context, name string) string {
	if m.templates == nil { // a core without templates (tests)
		return ""
	}
	if name == "" {
		name = m.cfg.DefaultTemplate
	}
	tmpl, err := m.template(ctx, name)
	if err != nil {
		return ""
	}
	return tmpl.Spec.Runtime
}

// ResolveRuntime implements HiddenCore.
func (m *Manager) ResolveRuntime(ctx context.Context, template, asked string) (string, error) {
	req := api.CreateSandboxRequest{Runtime: asked}
	if asked == "" && m.templates != nil {
		if template == "" {
			template = m.cfg.DefaultTemplate
		}
		if spec, ok := templates.SpecOf(ctx, m.templates, tenant.From(ctx).Lookup(template, true), template); ok {
			req.Runtime = spec.Runtime
		}
	}
	if _, err := m.resolveRuntime(&req); err != nil {
		return "", err
	}
	return req.Runtime, nil
}

// backendInfos describes every backend, the default first, then those
// marked unavailable.
func (m *Manager) backendInfos() []api.BackendInfo {
	var out []api.BackendInfo
	for _, b := range m.backends.All() {
		caps := b.Capabilities()
		info := api.BackendInfo{
			Name:         caps.Name,
			Default:      caps.Name == m.backends.DefaultName(),
			Capabilities: append([]string{}, caps.Features...),
			CgroupMode:   caps.CgroupMode,
		}
		if d, ok := b.(runtime.Describer); ok {
			info.Details = d.Describe()
		}
		out = append(out, info)
	}
	unavailable := m.backends.Unavailable()
	for _, name := range slices.Sorted(maps.Keys(unavailable)) {
		out = append(out, api.BackendInfo{Name: name, Capabilities: []string{}, Unavailable: unavailable[name].Error()})
	}
	return out
}

// cleanupRuntime has rec's backend remove whatever is left of the sandbox
// on the host (runtime.Backend.Cleanup). It fails, touching nothing, when
// this daemon does not run that backend.
func (m *Manager) cleanupRuntime(ctx context.Context, rec store.SandboxRecord) error {
	b, err := m.backendOf(rec)
	if err != nil {
		return err
	}
	return b.Cleanup(ctx, m.runtimeSpec(rec))
}
