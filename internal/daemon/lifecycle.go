package daemon

import (
	"context"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/httpapi"
)

// The Manager's lifecycle methods (state changes, transitions,
// create-or-get by name) reach the HTTP edge through the service adapter.
var _ httpapi.LifecycleService = service{}

// PauseSandbox implements httpapi.LifecycleService.
func (s service) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return s.Manager.SetState(ctx, id, api.StatePaused)
}

// ResumeSandbox implements httpapi.LifecycleService.
func (s service) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return s.Manager.SetState(ctx, id, api.StateRunning)
}

// HibernateSandbox implements httpapi.LifecycleService.
func (s service) HibernateSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return s.Manager.SetState(ctx, id, api.StateHibernated)
}

// SandboxTransitions implements httpapi.LifecycleService
// (sandbox.Handle.Transitions).
func (s service) SandboxTransitions(ctx context.Context, id string) ([]api.Transition, error) {
	h, err := s.Manager.Handle(ctx, id)
	if err != nil {
		return nil, err
	}
	return h.Transitions(), nil
}
