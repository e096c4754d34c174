package httpapi

import (
	"context"
	"fmt"
	"github.com/agentbox/agentbox/internal/errdefs"
	"io"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// UpgradeService is implemented by a Service that can swap the guest
// (runner) of existing sandboxes; its routes exist only then. The contract
// of Service applies. Runner binaries are untrusted until validated: the
// service runs their self-check before it keeps or uses one.
type UpgradeService interface {
	// StageRunner validates the agentbox binary read from r and keeps it
	// as a runner (ErrInvalidArgument when it fails its self-check).
	StageRunner(ctx context.Context, r io.Reader) (api.Runner, error)
	// ListRunners lists the runners in place.
	ListRunners(ctx context.Context) ([]api.Runner, error)
	// UpgradeSandbox moves sandbox id's guest onto the runner req names;
	// on failure the sandbox runs a guest that started before (the error
	// says which) and its files are untouched.
	UpgradeSandbox(ctx context.Context, id string, req api.UpgradeRequest) (api.UpgradeResult, error)
}

// maxRunnerBody bounds an uploaded runner binary.
const maxRunnerBody = 512 << 20

// upgradeRoutes are the routes of UpgradeService, when svc has it.
func (h *handler) upgradeRoutes() []route {
	us, ok := h.svc.(UpgradeService)
	if !ok {
		return nil
	}
	u := upgradeHandlers{h: h, svc: us}
	return []route{
		{"POST", "/v1/sandboxes/{id}/upgrade", u.upgrade},
		{"GET", "/v1/runners", u.list},
		{"POST", "/v1/runners", u.stage},
	}
}

type upgradeHandlers struct {
	h   *handler
	svc UpgradeService
}

func (u upgradeHandlers) upgrade(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.UpgradeRequest
	if err := u.h.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	// A host path makes the daemon open and run (locked down) a file of
	// the host: only the host's root, on the unix socket, may name one.
	// API-key callers upload the binary (POST /v1/runners) and name its hash.
	if req.Runner != "" && CallerFrom(r.Context()) != callerUnixSocket {
		return fmt.Errorf("a runner given by host path is accepted on the unix socket only; upload it with POST /v1/runners and pass runner_hash: %w", errdefs.ErrPermissionDenied)
	}
	res, err := u.svc.UpgradeSandbox(r.Context(), id, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (u upgradeHandlers) list(w http.ResponseWriter, r *http.Request) error {
	rs, err := u.svc.ListRunners(r.Context())
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []api.Runner{}
	}
	writeJSON(w, http.StatusOK, api.RunnerList{Runners: rs})
	return nil
}

func (u upgradeHandlers) stage(w http.ResponseWriter, r *http.Request) error {
	body := http.MaxBytesReader(w, r.Body, maxRunnerBody)
	if u.h.opts.MaxUploadBytes > 0 && u.h.opts.MaxUploadBytes < maxRunnerBody {
		body = http.MaxBytesReader(w, r.Body, u.h.opts.MaxUploadBytes)
	}
	rn, err := u.svc.StageRunner(r.Context(), body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, rn)
	return nil
}
