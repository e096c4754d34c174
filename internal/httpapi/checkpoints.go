package httpapi

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// CheckpointService is implemented by a Service that can checkpoint,
// restore and fork sandboxes; its routes exist only then. The contract of
// Service applies; checkpoint ids are validated like sandbox ids.
type CheckpointService interface {
	// CreateCheckpoint captures the running sandbox's filesystem (frozen
	// meanwhile) as an immutable checkpoint.
	CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (api.Checkpoint, error)
	// ListCheckpoints lists the checkpoints of sandbox id, or all when id
	// is "".
	ListCheckpoints(ctx context.Context, id string) ([]api.Checkpoint, error)
	// GetCheckpoint returns one checkpoint.
	GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error)
	// DeleteCheckpoint deletes a checkpoint; ErrConflict while a sandbox
	// runs on it.
	DeleteCheckpoint(ctx context.Context, cid string) error
	// Restore puts the sandbox back to a checkpoint (id or name), restarting
	// its processes.
	Restore(ctx context.Context, id, checkpoint string) (api.RestoreResult, error)
	// ForkCheckpoint creates sandboxes from a checkpoint.
	ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error)
	// ForkSandbox checkpoints a running sandbox and forks that checkpoint.
	ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error)
}

// checkpointRoutes are the routes of CheckpointService, when svc has it.
func (h *handler) checkpointRoutes() []route {
	cs, ok := h.svc.(CheckpointService)
	if !ok {
		return nil
	}
	c := checkpointHandlers{h: h, svc: cs}
	return append([]route{
		{"POST", "/v1/sandboxes/{id}/checkpoints", withBody(h, sandboxID, http.StatusCreated, cs.CreateCheckpoint)},
		{"GET", "/v1/sandboxes/{id}/checkpoints", c.listOfSandbox},
		{"POST", "/v1/sandboxes/{id}/restore", c.restore},
		{"POST", "/v1/sandboxes/{id}/fork", withBody(h, sandboxID, http.StatusCreated, cs.ForkSandbox)},
		{"GET", "/v1/checkpoints", c.listAll},
		{"GET", "/v1/checkpoints/{cid}", c.get},
		{"DELETE", "/v1/checkpoints/{cid}", c.delete},
		{"POST", "/v1/checkpoints/{cid}/fork", withBody(h, checkpointID, http.StatusCreated, cs.ForkCheckpoint)},
	}, h.diffRoutes()...) // diff, merge and template save build on checkpoints
}

type checkpointHandlers struct {
	h   *handler
	svc CheckpointService
}

func checkpointID(r *http.Request) (string, error) {
	id := r.PathValue("cid")
	if !sandboxIDRe.MatchString(id) {
		return "", errorf("invalid checkpoint id %q: want ^[a-z0-9][a-z0-9-]{0,63}$", clip(id))
	}
	return id, nil
}

// listAll serves GET of a whole collection: the result of list, never
// null, wrapped by wrap into its list body.
func listAll[T, L any](list func(context.Context) ([]T, error), wrap func([]T) L) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		items, err := list(r.Context())
		if err != nil {
			return err
		}
		if items == nil {
			items = []T{}
		}
		writeJSON(w, http.StatusOK, wrap(items))
		return nil
	}
}

// withBody serves a call on the object named by the path (read with
// pathID) with a JSON body that may be empty, answering its result as JSON
// with status.
func withBody[Req, Res any](h *handler, pathID func(*http.Request) (string, error), status int, call func(context.Context, string, Req) (Res, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r)
		if err != nil {
			return err
		}
		var req Req
		if err := h.decodeJSON(w, r, &req, true); err != nil {
			return err
		}
		res, err := call(r.Context(), id, req)
		if err != nil {
			return err
		}
		writeJSON(w, status, res)
		return nil
	}
}

func (c checkpointHandlers) listOfSandbox(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	return c.list(w, r, id)
}

func (c checkpointHandlers) listAll(w http.ResponseWriter, r *http.Request) error {
	return c.list(w, r, "")
}

func (c checkpointHandlers) list(w http.ResponseWriter, r *http.Request, id string) error {
	cks, err := c.svc.ListCheckpoints(r.Context(), id)
	if err != nil {
		return err
	}
	if cks == nil {
		cks = []api.Checkpoint{}
	}
	writeJSON(w, http.StatusOK, api.CheckpointList{Checkpoints: cks})
	return nil
}

func (c checkpointHandlers) get(w http.ResponseWriter, r *http.Request) error {
	cid, err := checkpointID(r)
	if err != nil {
		return err
	}
	ck, err := c.svc.GetCheckpoint(r.Context(), cid)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ck)
	return nil
}

func (c checkpointHandlers) delete(w http.ResponseWriter, r *http.Request) error {
	cid, err := checkpointID(r)
	if err != nil {
		return err
	}
	if err := c.svc.DeleteCheckpoint(r.Context(), cid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (c checkpointHandlers) restore(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.RestoreRequest
	if err := c.h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Checkpoint == "" || len(req.Checkpoint) > 128 {
		return errorf("checkpoint must be a checkpoint id or name of at most 128 bytes")
	}
	res, err := c.svc.Restore(r.Context(), id, req.Checkpoint)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
