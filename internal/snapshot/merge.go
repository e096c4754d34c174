package snapshot

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxfiles"
)

// Merge.
//
// Merge applies the changes a source sandbox made since its common
// ancestor with the target (the checkpoint one of them was forked from) to
// the target. It is a three-way merge of paths: "ours" are the target's
// changes since the base, "theirs" the source's. A path only theirs
// changed is applied; a path both changed to different results is a
// conflict, and unless every conflict is resolved (a strategy or a
// per-path choice) nothing is applied and the merge fails with
// ErrConflict.
//
// The target is checkpointed first and the merge is planned against that
// checkpoint (immutable), with the source's lifecycle lock held shared.
// Changes are applied through the target's guest (a tar stream extracted
// inside the sandbox, and removals), never by writing into its upper
// directory on the host. On any failure the target is restored to the
// checkpoint, so the caller sees all of the merge or none of it; the
// checkpoint stays (labelled agentbox.implicit=merge) as an undo point.
//
// The identity files every fork gets fresh (internal/identity) take no
// part unless the request includes them: siblings' merges would otherwise
// always conflict on them, and a merge would copy one sandbox's identity
// into another.

// maxResolutions bounds the per-path choices of one merge request.
const maxResolutions = 10000

func validateMerge(target string, req api.MergeRequest) error {
	if req.From == "" || req.From == target {
		return fmt.Errorf("from must be another sandbox's id: %w", errdefs.ErrInvalidArgument)
	}
	switch req.Strategy {
	case "", api.MergeFail, api.MergeOurs, api.MergeTheirs:
	default:
		return fmt.Errorf("strategy %q: want fail, ours or theirs: %w", req.Strategy, errdefs.ErrInvalidArgument)
	}
	if len(req.Resolutions) > maxResolutions {
		return fmt.Errorf("at most %d resolutions: %w", maxResolutions, errdefs.ErrInvalidArgument)
	}
	for p, side := range req.Resolutions {
		if !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.ContainsRune(p, 0) {
			return fmt.Errorf("resolution path %q must be absolute: %w", p, errdefs.ErrInvalidArgument)
		}
		if side != api.MergeOurs && side != api.MergeTheirs {
			return fmt.Errorf("resolution of %q is %q: want ours or theirs: %w", p, side, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// mergeBase finds the checkpoint that is the common ancestor of sandboxes
// target and from: the fork base of one of them taken of the other, or the
// fork base they share.
func (m *Snapshots) mergeBase(ctx context.Context, target, from string) (api.Checkpoint, error) {
	th, err := m.sbx.Handle(ctx, target)
	if err != nil {
		return api.Checkpoint{}, err
	}
	fh, err := m.sbx.Handle(ctx, from)
	if err != nil {
		return api.Checkpoint{}, fmt.Errorf("source: %w", err)
	}
	tBase, fBase := th.ForkBase(), fh.ForkBase()
	for _, cand := range []struct{ base, other string }{{fBase, target}, {tBase, from}} {
		if cand.base == "" {
			continue
		}
		ck, err := m.GetCheckpoint(ctx, cand.base)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return api.Checkpoint{}, err
		}
		if ck.SandboxID == cand.other || cand.base == tBase && cand.base == fBase {
			return ck, nil
		}
	}
	return api.Checkpoint{}, fmt.Errorf("sandboxes %s and %s have no common fork point (neither was forked from the other, nor both from one checkpoint that still exists): %w", from, target, errdefs.ErrFailedPrecondition)
}

// mergePlan is the outcome of planning a merge.
type mergePlan struct {
	apply      []layers.Change // theirs, in path order
	conflicts  []api.MergeConflict
	unresolved []string
}

// planMerge computes the three-way merge of base, ours and theirs.
func planMerge(ctx context.Context, base, ours, theirs *layers.View, req api.MergeRequest) (mergePlan, error) {
	ourChanges, err := layers.Diff(ctx, base, ours)
	if err != nil {
		return mergePlan{}, err
	}
	theirChanges, err := layers.Diff(ctx, base, theirs)
	if err != nil {
		return mergePlan{}, err
	}
	if !req.IncludeIdentity {
		ourChanges, theirChanges = withoutIdentity(ourChanges), withoutIdentity(theirChanges)
	}
	ourSet := make(map[string]layers.Change, len(ourChanges))
	for _, c := range ourChanges {
		ourSet[c.Path] = c
	}
	theirSet := make(map[string]bool, len(theirChanges))
	for _, c := range theirChanges {
		theirSet[c.Path] = true
	}
	strategy := req.Strategy
	if strategy == "" {
		strategy = api.MergeFail
	}
	var plan mergePlan
	conflict := func(c layers.Change, ourEntry *layers.Entry) (take bool, err error) {
		mc := api.MergeConflict{Path: c.Path}
		if mc.Base, err = fileMeta(c.Old, true); err != nil {
			return false, err
		}
		if mc.Ours, err = fileMeta(ourEntry, true); err != nil {
			return false, err
		}
		if mc.Theirs, err = fileMeta(c.New, true); err != nil {
			return false, err
		}
		plan.conflicts = append(plan.conflicts, mc)
		side := req.Resolutions[c.Path]
		if side == "" {
			side = strategy
		}
		switch side {
		case api.MergeTheirs:
			return true, nil
		case api.MergeOurs:
			return false, nil
		}
		plan.unresolved = append(plan.unresolved, c.Path)
		return false, nil
	}
	for _, c := range theirChanges {
		take := true
		if oc, both := ourSet[c.Path]; both {
			same := oc.New == nil && c.New == nil
			if oc.New != nil && c.New != nil {
				if same, err = layers.SameEntry(oc.New, c.New); err != nil {
					return mergePlan{}, err
				}
			}
			if same {
				continue // both made the same change
			}
			if take, err = conflict(c, oc.New); err != nil {
				return mergePlan{}, err
			}
		} else if c.Kind == layers.Deleted && c.Old.Type == layers.TypeDir {
			// Theirs removed a directory: a conflict when ours put or
			// changed anything inside it.
			prefix := c.Path + "/"
			for p := range ourSet {
				if strings.HasPrefix(p, prefix) && !theirSet[p] && ourSet[p].New != nil {
					if take, err = conflict(c, ours.Get(c.Path)); err != nil {
						return mergePlan{}, err
					}
					break
				}
			}
		}
		if take {
			plan.apply = append(plan.apply, c)
		}
	}
	slices.SortFunc(plan.conflicts, func(a, b api.MergeConflict) int { return strings.Compare(a.Path, b.Path) })
	return plan, nil
}

// Merge merges the changes of sandbox req.From into sandbox target; see
// the package comment above. With unresolved conflicts it returns the
// result (with the conflicts) and an error wrapping errdefs.ErrConflict.
func (m *Snapshots) Merge(ctx context.Context, target string, req api.MergeRequest) (_ api.MergeResult, err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpMerge, target, "", start, err) }()
	if err := validateMerge(target, req); err != nil {
		return api.MergeResult{}, fmt.Errorf("merging into %s: %w", target, err)
	}
	base, err := m.mergeBase(ctx, target, req.From)
	if err != nil {
		return api.MergeResult{}, fmt.Errorf("merging %s into %s: %w", req.From, target, err)
	}
	res := api.MergeResult{Base: base.ID, Applied: []api.DiffChange{}, Conflicts: []api.MergeConflict{}}
	var ours fsState
	if req.DryRun {
		if ours, err = m.sandboxState(ctx, target); err != nil {
			return res, err
		}
	} else {
		ck, err := m.CreateCheckpoint(ctx, target, api.CreateCheckpointRequest{Name: "merge", Labels: map[string]string{LabelImplicit: "merge"}})
		if err != nil {
			return res, fmt.Errorf("merging into %s: %w", target, err)
		}
		res.Checkpoint = ck.ID
		defer m.pin(ck.ID)() // the merge's plan and undo point
		m.PruneImplicit(ctx, target)
		if ours, err = m.checkpointState(ctx, ck.ID); err != nil {
			return res, err
		}
	}
	defer ours.release()
	wrote := false
	plan, err := m.planMergeOf(ctx, base, ours, req.From, func(theirs fsState, plan mergePlan) error {
		for _, c := range plan.apply {
			dc, err := diffChange(c, true)
			if err != nil {
				return err
			}
			res.Applied = append(res.Applied, dc)
		}
		if len(plan.unresolved) > 0 || req.DryRun {
			return nil
		}
		wrote = true
		return m.applyChanges(ctx, target, plan.apply)
	}, req)
	if plan.conflicts != nil {
		res.Conflicts = plan.conflicts
	}
	if err == nil && len(plan.unresolved) > 0 {
		err = fmt.Errorf("merging %s into %s: %d conflicting paths (e.g. %s) need a strategy or resolutions; nothing was applied: %w",
			req.From, target, len(plan.unresolved), plan.unresolved[0], errdefs.ErrConflict)
	}
	if req.DryRun {
		return res, err
	}
	if err != nil {
		res.Applied = nil
		cctx := context.WithoutCancel(ctx)
		if !wrote {
			// Nothing was written: the checkpoint is not needed.
			if derr := m.DeleteCheckpoint(cctx, res.Checkpoint); derr != nil {
				m.log.WarnContext(ctx, "deleting merge checkpoint", "checkpoint", res.Checkpoint, "err", derr)
			}
		} else if _, rerr := m.Restore(cctx, target, res.Checkpoint); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restoring %s after the failed merge: %w", target, rerr))
		}
		res.Checkpoint = ""
		return res, err
	}
	m.log.InfoContext(ctx, "sandboxes merged", "from", req.From, "into", target, "base", res.Base,
		"applied", len(res.Applied), "conflicts", len(res.Conflicts))
	return res, nil
}

// planMergeOf plans the merge of sandbox from into the state ours and
// calls then with the plan while from's lifecycle lock is held shared (its
// files are read from the host meanwhile).
func (m *Snapshots) planMergeOf(ctx context.Context, base api.Checkpoint, ours fsState, from string, then func(fsState, mergePlan) error, req api.MergeRequest) (mergePlan, error) {
	baseState, err := m.checkpointState(ctx, base.ID)
	if err != nil {
		return mergePlan{}, fmt.Errorf("merge base: %w", err)
	}
	theirs, err := m.sandboxState(ctx, from)
	if err != nil {
		return mergePlan{}, fmt.Errorf("merge source: %w", err)
	}
	defer theirs.release()
	var views [3]*layers.View
	for i, s := range []fsState{baseState, ours, theirs} {
		if views[i], err = m.view(ctx, s); err != nil {
			return mergePlan{}, err
		}
	}
	plan, err := planMerge(ctx, views[0], views[1], views[2], req)
	if err != nil {
		return plan, fmt.Errorf("planning merge: %w", err)
	}
	return plan, then(theirs, plan)
}

// applyChanges writes changes (theirs, in path order) into sandbox id
// through its guest: removals first (deepest first, and whatever a changed
// type replaces), then one tar stream of every added or modified entry.
func (m *Snapshots) applyChanges(ctx context.Context, id string, changes []layers.Change) error {
	var removals []string
	var writes []*layers.Entry
	for _, c := range changes {
		switch {
		case c.New == nil:
			removals = append(removals, c.Path)
		case c.Old != nil && c.Old.Type != c.New.Type:
			removals = append(removals, c.Path)
			writes = append(writes, c.New)
		default:
			writes = append(writes, c.New)
		}
	}
	slices.SortFunc(removals, func(a, b string) int { return -strings.Compare(a, b) })
	files := sandboxfiles.New(m.sbx)
	for _, p := range removals {
		if err := files.Remove(ctx, id, p, true); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("removing %s: %w", p, err)
		}
	}
	if len(writes) == 0 {
		return nil
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, writes)) }()
	err := files.WriteArchive(ctx, id, "/", pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return fmt.Errorf("writing changes: %w", err)
	}
	return nil
}

// writeTar writes entries (path order) as a tar stream with names relative
// to "/". File content is read with O_NOFOLLOW; a file whose size changed
// since it was planned fails the stream. Devices, fifos and sockets are
// not carried (the guest does not create them).
func writeTar(w io.Writer, entries []*layers.Entry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		if e.Path == "/" {
			continue
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(e.Path, "/"), Mode: int64(e.Mode), Uid: int(e.UID), Gid: int(e.GID), Format: tar.FormatPAX}
		if fi, err := os.Lstat(e.HostPath); err == nil {
			hdr.ModTime = fi.ModTime()
		}
		switch e.Type {
		case layers.TypeDir:
			hdr.Typeflag = tar.TypeDir
		case layers.TypeSymlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
		case layers.TypeFile:
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
		default:
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.Type == layers.TypeFile {
			if err := copyEntry(tw, e); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyEntry(w io.Writer, e *layers.Entry) error {
	f, err := layers.OpenEntry(e)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, e.Size+1))
	if err == nil && n != e.Size {
		err = fmt.Errorf("%s changed size while it was merged: %w", e.Path, errdefs.ErrConflict)
	}
	return err
}
