package agentbox

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// Transition is one recorded change of a sandbox's state, with its cause.
type Transition = api.Transition

// IdlePolicy sets when an idle sandbox is paused, hibernated and deleted
// (seconds; 0 takes the preset's default, -1 means never).
type IdlePolicy = api.IdlePolicy

// Lifecycle presets for SandboxSpec.Lifecycle.
const (
	LifecycleSession    = api.LifecycleSession
	LifecyclePersistent = api.LifecyclePersistent
)

// Pause freezes every process of the sandbox; its memory is kept. Any
// exec, file or attach call resumes it transparently.
func (s *Sandbox) Pause(ctx context.Context) error {
	return s.lifecycle(ctx, "pause")
}

// Resume brings a paused or hibernated (or stopped) sandbox back to running.
func (s *Sandbox) Resume(ctx context.Context) error {
	return s.lifecycle(ctx, "resume")
}

// Hibernate stops every process of the sandbox, keeping its filesystem on
// disk; the next call (or Resume) starts it again with the same id.
func (s *Sandbox) Hibernate(ctx context.Context) error {
	return s.lifecycle(ctx, "hibernate")
}

func (s *Sandbox) lifecycle(ctx context.Context, op string) error {
	var info api.Sandbox
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/" + op)}, &info); err != nil {
		return wrapf(err, "%s sandbox %s", op, s.id)
	}
	s.mu.Lock()
	s.info = info
	s.mu.Unlock()
	return nil
}

// Transitions returns the sandbox's newest state transitions, oldest first.
func (s *Sandbox) Transitions(ctx context.Context) ([]Transition, error) {
	var list api.TransitionList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/transitions")}, &list); err != nil {
		return nil, wrapf(err, "listing transitions of sandbox %s", s.id)
	}
	return list.Transitions, nil
}
