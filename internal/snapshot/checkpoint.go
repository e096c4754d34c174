package snapshot

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/validate"
)

// Checkpoints.
//
// A checkpoint is the sandbox's writable overlay upper directory, copied
// while the sandbox is frozen into a new immutable layer of the layer store
// whose parent is the top of the layers the sandbox runs on, plus a record
// in the metadata store. The record holds a reference on its layer
// ("checkpoint/<id>"); every sandbox that runs on a checkpoint (forked or restored) holds one on its top layer
// (sandbox.LayerOwner), so a checkpoint a sandbox runs on cannot be deleted.
// Sandboxes created from a template rely on the template's reference.
//
// Restore replaces the sandbox's layers by the checkpoint's chain and its
// upper by an empty directory, and restarts its guest under the same id and
// socket: every file is then exactly as captured, whatever happened to the
// template's files since. Processes do not survive a restore. A backend able
// to checkpoint memory could add that as an optional interface next to
// runtime.Pauser; the filesystem path here would stay as it is.
//
// Checkpoint, restore and fork of a sandbox take its lifecycle lock
// exclusively (sandbox.Manager.LockFiles for checkpoint and fork, which
// leave a sleeping sandbox asleep; LockRunning for restore, which needs a
// guest): they are serialised with each other, with delete, with the idle
// policy, and with the set-up of exec and file calls. Each is recorded in
// the sandbox's transitions (causes checkpoint and restore).

// Owners of layer references.
func checkpointRef(id string) string { return "checkpoint/" + id }

const maxCheckpointName = 128

// checkpoints returns the checkpoint store, or ErrFailedPrecondition when
// the daemon was assembled without one.
func (m *Snapshots) checkpoints() (store.CheckpointStore, *layers.Store, error) {
	if m.cs == nil || m.ls == nil {
		return nil, nil, fmt.Errorf("checkpoints need a layer store and a checkpoint store: %w", errdefs.ErrFailedPrecondition)
	}
	return m.cs, m.ls, nil
}

func validateCheckpointRequest(req api.CreateCheckpointRequest) error {
	if len(req.Name) > maxCheckpointName || strings.ContainsAny(req.Name, "\x00\n") {
		return fmt.Errorf("checkpoint name must be at most %d characters on one line: %w", maxCheckpointName, errdefs.ErrInvalidArgument)
	}
	return validate.Labels(req.Labels)
}

// CreateCheckpoint captures the sandbox's filesystem as a checkpoint. A
// running sandbox is frozen while its changes are copied and thawed on
// every path; its processes keep running afterwards. A paused or
// hibernated sandbox is not woken: its files are copied as they lie and
// it stays as it was. The returned DurationMS is the time it was frozen.
// The checkpoint shows in the sandbox's transitions (cause checkpoint).
func (m *Snapshots) CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (_ api.Checkpoint, err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpCheckpoint, id, req.Name, start, err) }()
	if err := validateCheckpointRequest(req); err != nil {
		return api.Checkpoint{}, fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	lock := m.sbx.LockFiles
	if req.Memory { // needs its processes running
		lock = m.sbx.LockRunning
	}
	h, unlock, err := lock(ctx, id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	defer unlock()
	rec, err := m.checkpointLocked(ctx, h, req)
	if err != nil {
		return api.Checkpoint{}, fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	m.log.InfoContext(ctx, "checkpoint created", "sandbox", id, "checkpoint", rec.Checkpoint.ID,
		"size", rec.Checkpoint.SizeBytes, "frozen_ms", rec.Checkpoint.DurationMS)
	m.describe(&rec.Checkpoint)
	return rec.Checkpoint, nil
}

// checkpointLocked does CreateCheckpoint with h's lock held exclusively
// (LockFiles or LockRunning).
func (m *Snapshots) checkpointLocked(ctx context.Context, h *sandbox.Handle, req api.CreateCheckpointRequest) (_ store.CheckpointRecord, retErr error) {
	cs, ls, err := m.checkpoints()
	if err != nil {
		return store.CheckpointRecord{}, err
	}
	sb := h.Sandbox()
	upper, lowers := h.Dirs()
	if len(lowers) == 0 {
		return store.CheckpointRecord{}, fmt.Errorf("sandbox has no layers: %w", errdefs.ErrFailedPrecondition)
	}
	parent, err := ls.ByPath(lowers[0])
	if err != nil {
		return store.CheckpointRecord{}, fmt.Errorf("top layer: %w", err)
	}

	cid := sandbox.NewID()
	image := ""
	if req.Memory {
		if image, err = m.prepareMemory(ctx, h, req, cid); err != nil {
			return store.CheckpointRecord{}, err
		}
		defer func() {
			if retErr != nil {
				m.removeMemory(image)
			}
		}()
	}
	start := time.Now()
	var layer layers.Layer
	copyUpper := func() (err error) {
		layer, err = ls.CreateFromCopy(ctx, upper, layers.CreateOptions{Parent: parent.ID})
		return err
	}
	if req.Memory {
		err = h.CheckpointMemory(ctx, image, copyUpper)
	} else {
		err = h.Frozen(ctx, copyUpper)
	}
	frozen := time.Since(start)
	if err != nil {
		if layer.ID != "" {
			m.dropUnused(context.WithoutCancel(ctx), layer.ID)
		}
		return store.CheckpointRecord{}, err
	}
	// Thawed already: a chain grown too deep is squashed off the clock.
	if layer, err = m.boundChain(ctx, layer); err != nil {
		return store.CheckpointRecord{}, err
	}
	chain, err := ls.Chain(layer.ID)
	if err != nil {
		return store.CheckpointRecord{}, err
	}
	rec := store.CheckpointRecord{
		Checkpoint: api.Checkpoint{
			ID:         cid,
			Tenant:     tenant.Owner(sb.Tenant),
			Name:       req.Name,
			Labels:     maps.Clone(req.Labels),
			SandboxID:  sb.ID,
			Template:   sb.Template,
			SizeBytes:  layer.Size,
			CreatedAt:  time.Now().UTC(),
			DurationMS: frozen.Milliseconds(),
			Memory:     req.Memory,
		},
		MemoryImage: image,
		Layer:       layer.ID,
		Env:         maps.Clone(sb.Env),
		Resources:   sb.Resources,
		TemplateID:  sb.TemplateID,
		Backend:     sb.Backend,
	}
	for _, l := range chain {
		rec.Checkpoint.Layers = append(rec.Checkpoint.Layers, l.ID)
	}
	// The reference first, then the admission against the tenant's disk
	// quota, then the record: a crash in between leaves an unlisted layer
	// (garbage for the collector), never a listed checkpoint without its
	// layer; a layer over the quota is dropped before anything lists it.
	if err := ls.Ref(ctx, layer.ID, checkpointRef(cid)); err != nil {
		return store.CheckpointRecord{}, err
	}
	release, err := m.admitLayer(ctx, rec.Checkpoint.Tenant, layer.ID)
	if err != nil {
		m.dropLayer(context.WithoutCancel(ctx), layer.ID, checkpointRef(cid))
		return store.CheckpointRecord{}, err
	}
	defer release()
	if err := cs.PutCheckpoint(ctx, rec); err != nil {
		m.dropLayer(context.WithoutCancel(ctx), layer.ID, checkpointRef(cid))
		return store.CheckpointRecord{}, err
	}
	if err := h.Note(ctx, api.CauseCheckpoint, cid); err != nil {
		m.log.WarnContext(ctx, "recording the checkpoint in the sandbox's transitions", "sandbox", sb.ID, "err", err)
	}
	return rec, nil
}

// dropLayer releases owner's reference on layer id and removes the layer
// when nothing else uses it. A layer still in use is kept (not an error).
func (m *Snapshots) dropLayer(ctx context.Context, id, owner string) {
	ls := m.ls
	if err := ls.Unref(ctx, id, owner); err != nil {
		m.log.WarnContext(ctx, "releasing layer", "layer", id, "owner", owner, "err", err)
		return
	}
	l, err := ls.Get(id)
	if err != nil || len(l.Refs) > 0 {
		return
	}
	if err := ls.Remove(ctx, id); err != nil && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
		m.log.WarnContext(ctx, "removing layer", "layer", id, "err", err)
	}
}

// ListCheckpoints returns the checkpoints taken of sandbox id, oldest
// first; id "" lists all. Checkpoints outlive their sandbox: listing those
// of a deleted sandbox works while any are left, then it is ErrNotFound.
func (m *Snapshots) ListCheckpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	cs, _, err := m.checkpoints()
	if err != nil {
		return nil, err
	}
	recs, err := cs.ListCheckpoints(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Checkpoint{}
	p := tenant.From(ctx)
	for _, r := range recs {
		if (id == "" || r.Checkpoint.SandboxID == id) && p.Sees(r.Checkpoint.Tenant) {
			r.Checkpoint.DurationMS = 0
			m.describe(&r.Checkpoint)
			out = append(out, r.Checkpoint)
		}
	}
	if id != "" && len(out) == 0 {
		if _, err := m.sbx.Handle(ctx, id); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out, func(a, b api.Checkpoint) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// GetCheckpoint returns one checkpoint.
func (m *Snapshots) GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error) {
	rec, err := m.checkpointRecord(ctx, cid)
	if err != nil {
		return api.Checkpoint{}, err
	}
	rec.Checkpoint.DurationMS = 0
	m.describe(&rec.Checkpoint)
	return rec.Checkpoint, nil
}

// checkpointRecord returns checkpoint cid if the caller of ctx may see it;
// another tenant's checkpoint is ErrNotFound exactly like an unknown id.
func (m *Snapshots) checkpointRecord(ctx context.Context, cid string) (store.CheckpointRecord, error) {
	cs, _, err := m.checkpoints()
	if err != nil {
		return store.CheckpointRecord{}, err
	}
	rec, err := cs.GetCheckpoint(ctx, cid)
	if err != nil {
		return store.CheckpointRecord{}, err
	}
	if !tenant.From(ctx).Sees(rec.Checkpoint.Tenant) {
		return store.CheckpointRecord{}, fmt.Errorf("checkpoint %s: %w", cid, errdefs.ErrNotFound)
	}
	return rec, nil
}

// findCheckpointNamed finds ref, a checkpoint id, else the newest
// checkpoint named ref among those the caller of ctx sees that match
// (nil: all).
func (m *Snapshots) findCheckpointNamed(ctx context.Context, ref string, match func(api.Checkpoint) bool) (store.CheckpointRecord, error) {
	cs, _, err := m.checkpoints()
	if err != nil {
		return store.CheckpointRecord{}, err
	}
	rec, err := m.checkpointRecord(ctx, ref)
	if err == nil || !errdefs.IsNotFound(err) {
		return rec, err
	}
	recs, lerr := cs.ListCheckpoints(ctx)
	if lerr != nil {
		return store.CheckpointRecord{}, lerr
	}
	p := tenant.From(ctx)
	var found *store.CheckpointRecord
	for i, r := range recs {
		if r.Checkpoint.Name == ref && p.Sees(r.Checkpoint.Tenant) && (match == nil || match(r.Checkpoint)) &&
			(found == nil || r.Checkpoint.CreatedAt.After(found.Checkpoint.CreatedAt)) {
			found = &recs[i]
		}
	}
	if found == nil {
		return store.CheckpointRecord{}, err
	}
	return *found, nil
}

// resolveCheckpoint finds ref, a checkpoint id or the name of one of sandbox
// id's checkpoints (the newest of that name).
func (m *Snapshots) resolveCheckpoint(ctx context.Context, id, ref string) (store.CheckpointRecord, error) {
	return m.findCheckpointNamed(ctx, ref, func(c api.Checkpoint) bool { return c.SandboxID == id })
}

// DeleteCheckpoint deletes a checkpoint. It fails with ErrConflict while a
// sandbox runs on its layer (restored to it or forked from it) and no other
// checkpoint of identical content holds that layer. Its layer is
// removed unless other checkpoints share it or are stacked on it.
func (m *Snapshots) DeleteCheckpoint(ctx context.Context, cid string) (err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpDeleteCheckpoint, "", cid, start, err) }()
	cs, ls, err := m.checkpoints()
	if err != nil {
		return err
	}
	rec, err := m.checkpointRecord(ctx, cid)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	// Sandboxes running on the layer keep it alive through its last
	// checkpoint: identical states share one layer, so another checkpoint
	// of the same content may still hold it.
	l, err := ls.Get(rec.Layer)
	if err == nil {
		var users []string
		others := 0
		for _, r := range l.Refs {
			if s, ok := strings.CutPrefix(r, "sandbox/"); ok {
				users = append(users, s)
			} else if strings.HasPrefix(r, "checkpoint/") && r != checkpointRef(cid) {
				others++
			}
		}
		if len(users) > 0 && others == 0 {
			return fmt.Errorf("checkpoint %s is in use by sandboxes %s: %w", cid, strings.Join(users, ", "), errdefs.ErrConflict)
		}
	}
	if err := cs.DeleteCheckpoint(ctx, cid); err != nil {
		return err
	}
	m.dropLayer(ctx, rec.Layer, checkpointRef(cid))
	m.removeMemory(rec.MemoryImage)
	m.log.InfoContext(ctx, "checkpoint deleted", "checkpoint", cid)
	return nil
}

// Restore puts sandbox id back to checkpoint ref (an id, or the name of one
// of its checkpoints): its guest and every process are stopped, its layers
// become the checkpoint's chain with an empty writable layer on top, and
// the guest is started again under the same id, hostname and socket. A
// sleeping sandbox is woken first. The restore shows in the sandbox's
// transitions (cause restore).
func (m *Snapshots) Restore(ctx context.Context, id, ref string) (_ api.RestoreResult, err error) {
	start := time.Now()
	defer func() { m.report(ctx, sandbox.OpRestore, id, ref, start, err) }()
	if ref == "" {
		return api.RestoreResult{}, fmt.Errorf("restoring sandbox %s: checkpoint is required: %w", id, errdefs.ErrInvalidArgument)
	}
	rec, err := m.resolveCheckpoint(ctx, id, ref)
	if err != nil {
		return api.RestoreResult{}, fmt.Errorf("restoring sandbox %s: %w", id, err)
	}
	h, unlock, err := m.sbx.LockRunning(ctx, id)
	if err != nil {
		return api.RestoreResult{}, err
	}
	defer unlock()
	locked := time.Now()
	if err := m.restoreLocked(ctx, h, rec); err != nil {
		return api.RestoreResult{}, fmt.Errorf("restoring sandbox %s: %w", id, err)
	}
	d := time.Since(locked)
	if err := h.Note(ctx, api.CauseRestore, rec.Checkpoint.ID); err != nil {
		m.log.WarnContext(ctx, "recording the restore in the sandbox's transitions", "sandbox", id, "err", err)
	}
	m.log.InfoContext(ctx, "sandbox restored", "sandbox", id, "checkpoint", rec.Checkpoint.ID, "ms", d.Milliseconds())
	return api.RestoreResult{Sandbox: h.Sandbox(), Checkpoint: rec.Checkpoint.ID, DurationMS: d.Milliseconds()}, nil
}

// restoreLocked does Restore with h's lock held exclusively: the
// sandbox's reference moves to the checkpoint's layer and its files are
// reset to it (sandbox.Handle.Reset). When the guest cannot be started
// again the sandbox is left stopped (only delete works).
func (m *Snapshots) restoreLocked(ctx context.Context, h *sandbox.Handle, ck store.CheckpointRecord) error {
	ls := m.ls
	paths, err := ls.Paths(ck.Layer)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	if ck.MemoryImage != "" && ck.Backend != h.Sandbox().Backend {
		return fmt.Errorf("checkpoint %s holds the memory of a %s sandbox, this one runs on %s: %w",
			ck.Checkpoint.ID, ck.Backend, h.Sandbox().Backend, errdefs.ErrFailedPrecondition)
	}
	ctx = context.WithoutCancel(ctx) // a half-done restore must be finished
	id := h.ID()
	_, lowers := h.Dirs()
	if err := ls.Ref(ctx, ck.Layer, sandbox.LayerOwner(id)); err != nil {
		return err
	}
	oldTop := ""
	if len(lowers) > 0 {
		if l, err := ls.ByPath(lowers[0]); err == nil {
			oldTop = l.ID
		}
	}
	if err := h.ResetMemory(ctx, paths, ck.MemoryImage); err != nil {
		return err
	}
	if oldTop != "" && oldTop != ck.Layer {
		if err := ls.Unref(ctx, oldTop, sandbox.LayerOwner(id)); err != nil {
			m.log.WarnContext(ctx, "releasing layer", "layer", oldTop, "err", err)
		}
	}
	return nil
}

// OnDelete implements sandbox.DeleteHook: when sandbox id is deleted
// (the core has dropped its layer references), the checkpoints the daemon
// took on its own (LabelImplicit) that no fork runs on are deleted.
// Checkpoints the user asked for outlive the sandbox.
func (m *Snapshots) OnDelete(ctx context.Context, id string) {
	cs, _, err := m.checkpoints()
	if err != nil {
		return
	}
	recs, err := cs.ListCheckpoints(ctx)
	if err != nil {
		m.log.WarnContext(ctx, "listing checkpoints", "err", err)
		return
	}
	for _, r := range recs {
		if r.Checkpoint.SandboxID != id || r.Checkpoint.Labels[LabelImplicit] == "" {
			continue
		}
		if err := m.DeleteCheckpoint(ctx, r.Checkpoint.ID); err != nil && !errdefs.IsConflict(err) {
			m.log.WarnContext(ctx, "deleting implicit checkpoint", "checkpoint", r.Checkpoint.ID, "err", err)
		}
	}
}
