package httpapi

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// LifecycleService is implemented by a Service whose sandboxes can sleep
// (paused: frozen, memory kept; hibernated: nothing resident, filesystem
// kept) and be reused by name; its routes exist only then. The contract of
// Service applies.
type LifecycleService interface {
	// CreateOrGetSandbox is CreateSandbox, except that a request naming a
	// live sandbox returns that one (woken) with created false.
	CreateOrGetSandbox(ctx context.Context, req api.CreateSandboxRequest) (sb api.Sandbox, created bool, err error)
	// PauseSandbox freezes a running sandbox (no-op when paused).
	PauseSandbox(ctx context.Context, id string) (api.Sandbox, error)
	// ResumeSandbox brings a paused, hibernated, stopped or failed sandbox
	// back to running (no-op when running).
	ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error)
	// HibernateSandbox stops a running or paused sandbox's processes,
	// keeping its filesystem (no-op when hibernated).
	HibernateSandbox(ctx context.Context, id string) (api.Sandbox, error)
	// SandboxTransitions returns the sandbox's newest state transitions,
	// oldest first.
	SandboxTransitions(ctx context.Context, id string) ([]api.Transition, error)
}

// lifecycleRoutes are the routes of LifecycleService, when svc has it.
func (h *handler) lifecycleRoutes() []route {
	ls, ok := h.svc.(LifecycleService)
	if !ok {
		return nil
	}
	op := func(fn func(context.Context, string) (api.Sandbox, error)) handlerFunc {
		return func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			sb, err := fn(r.Context(), id)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, sb)
			return nil
		}
	}
	return []route{
		{"POST", "/v1/sandboxes/{id}/pause", op(ls.PauseSandbox)},
		{"POST", "/v1/sandboxes/{id}/resume", op(ls.ResumeSandbox)},
		{"POST", "/v1/sandboxes/{id}/hibernate", op(ls.HibernateSandbox)},
		{"GET", "/v1/sandboxes/{id}/transitions", func(w http.ResponseWriter, r *http.Request) error {
			id, err := sandboxID(r)
			if err != nil {
				return err
			}
			ts, err := ls.SandboxTransitions(r.Context(), id)
			if err != nil {
				return err
			}
			if ts == nil {
				ts = []api.Transition{}
			}
			writeJSON(w, http.StatusOK, api.TransitionList{Transitions: ts})
			return nil
		}},
	}
}

// validLifecycle checks the shape of a create request's lifecycle fields.
func validLifecycle(req *api.CreateSandboxRequest) error {
	if len(req.Name) > 64 || len(req.Lifecycle) > 32 {
		return errorf("name must be at most 64 bytes and lifecycle at most 32")
	}
	return noNUL("name", req.Name, req.Lifecycle)
}

// create creates a sandbox, or returns the live sandbox of req.Name: 201
// for a new sandbox, 200 for an existing one.
func (h *handler) create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, int, error) {
	if err := validLifecycle(&req); err != nil {
		return api.Sandbox{}, 0, err
	}
	if ls, ok := h.svc.(LifecycleService); ok {
		sb, created, err := ls.CreateOrGetSandbox(ctx, req)
		if err != nil || created {
			return sb, http.StatusCreated, err
		}
		return sb, http.StatusOK, nil
	}
	sb, err := h.svc.CreateSandbox(ctx, req)
	return sb, http.StatusCreated, err
}
