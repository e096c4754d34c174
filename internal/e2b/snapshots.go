package e2b

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Fork and snapshots: agentbox's fork and checkpoints.

func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var body forkBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	ctx := r.Context()
	res, err := s.sb.ForkSandbox(ctx, r.PathValue("id"), api.ForkRequest{Count: max(body.Count, 1)})
	if err != nil {
		return err
	}
	timeout := DefaultTimeout
	if body.Timeout != nil && *body.Timeout > 0 {
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	out := []forkResult{}
	for _, sb := range res.Sandboxes {
		if sb.Labels[LabelAutoPause] == "" {
			if t, err := s.sb.SetTimeout(ctx, sb.ID, timeout); err != nil {
				st := statusOf(err)
				out = append(out, forkResult{Error: &apiError{Code: st, Message: publicMessage(err, st)}})
				continue
			} else {
				sb = t
			}
		}
		c := s.created(sb)
		out = append(out, forkResult{Sandbox: &c})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body snapshotBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	ck, err := s.sb.CreateCheckpoint(r.Context(), r.PathValue("id"), api.CreateCheckpointRequest{Name: body.Name, Labels: map[string]string{LabelSnapshot: "true"}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(ck))
	return nil
}

func snapshotOf(ck api.Checkpoint) snapshotInfo {
	si := snapshotInfo{SnapshotID: ck.ID, Names: []string{}}
	if ck.Name != "" {
		si.Names = append(si.Names, ck.Name)
	}
	return si
}

// listSnapshots lists the caller's E2B snapshots (checkpoints taken
// through this front end), newest first, optionally of one sandbox.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	cks, err := s.sb.ListCheckpoints(r.Context(), q.Get("sandboxID"))
	if err != nil {
		return err
	}
	var after *pageToken
	if v := q.Get("nextToken"); v != "" {
		t, err := parsePageToken(v)
		if err != nil {
			return err
		}
		after = &t
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 {
			return fmt.Errorf("limit %q: want a positive number: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	slices.SortFunc(cks, func(a, b api.Checkpoint) int {
		return comparePage(a.CreatedAt, a.ID, pageToken{created: b.CreatedAt, id: b.ID})
	})
	out := []snapshotInfo{}
	var last api.Checkpoint
	for _, ck := range cks {
		if ck.Labels[LabelSnapshot] == "" || (q.Get("name") != "" && ck.Name != q.Get("name")) {
			continue
		}
		if after != nil && comparePage(ck.CreatedAt, ck.ID, *after) <= 0 {
			continue
		}
		if limit > 0 && len(out) == limit {
			w.Header().Set("X-Next-Token", pageToken{created: last.CreatedAt, id: last.ID}.String())
			break
		}
		out = append(out, snapshotOf(ck))
		last = ck
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is DELETE /templates/{id}: E2B deletes snapshots as
// templates; only snapshots are served here (another id is not found).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	ctx, id := r.Context(), r.PathValue("id")
	ck, err := s.sb.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	if ck.Labels[LabelSnapshot] == "" {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	if err := s.sb.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
