// Package snapshot is the checkpoint feature of the sandbox core:
// checkpoints (a sandbox's files captured as an immutable layer),
// restore, fork, exec transactions (checkpoint_before,
// rollback_on_failure), the diff of two filesystem states (a sandbox, a
// checkpoint, a template), a sandbox's tree hash, and the three-way merge
// of one sandbox's changes into another.
//
// It sits above the core (internal/sandbox): it is a sandbox.Extension
// (DeleteHook: implicit checkpoints go with their sandbox; PurgeHook: a
// purged tenant's checkpoints; RescueHook: a failed upgrade falls back to
// the latest checkpoint) and reaches sandboxes through the core's API for
// it (internal/sandbox/core_snapshot.go: LockRunning, LockFiles,
// Handle.Frozen, Handle.Reset, Handle.Note, CreateFork, Handle.ReadFS,
// ResolveTemplate). The core never imports
// it. See docs/EXTENSIONS.md.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/oci"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Sandboxes is what Snapshots needs of the sandbox core; *sandbox.Manager
// implements it.
type Sandboxes interface {
	sandbox.Core
	// Report shows the feature's operations to the core's observers.
	Report(ctx context.Context, op sandbox.Op)
	// The core's API for this feature (core_snapshot.go).
	LockRunning(ctx context.Context, id string) (*sandbox.Handle, func(), error)
	LockFiles(ctx context.Context, id string) (*sandbox.Handle, func(), error)
	CreateFork(ctx context.Context, spec sandbox.ForkSpec) (api.Sandbox, error)
	// ResolveTemplate resolves a template as a create would (the
	// caller's own templates first, then the catalogue).
	ResolveTemplate(ctx context.Context, name string) (templates.Template, error)
	// Calls as the API serves them.
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error)
}

var _ Sandboxes = (*sandbox.Manager)(nil)

// Config configures Snapshots.
type Config struct {
	// Layers is the layer store (sandbox.Config.Layers) and Checkpoints
	// the store of checkpoint records; without either, checkpoints,
	// restore and fork fail with ErrFailedPrecondition.
	Layers      *layers.Store
	Checkpoints store.CheckpointStore
	// IDs is the canonical host id range layers and upper dirs are owned
	// by on disk (sandbox.Config.IDs): a diff shows the ids the sandbox
	// sees.
	IDs runtime.IDMap
	// Quotas admits forks, checkpoints' layers and transactions' runs
	// against their tenant's quotas: the Manager's (sandbox.Config.Quotas).
	// Nil limits nothing.
	Quotas sandbox.Quotas
	// Retention bounds the checkpoints the daemon takes on its own
	// (LabelImplicit); the zero value keeps them all.
	Retention Retention
	// MemoryDir holds memory checkpoints' images (a directory per
	// checkpoint, root only); "": memory checkpoints fail with
	// ErrFailedPrecondition.
	MemoryDir string
	Logger    *slog.Logger
}

// Snapshots serves checkpoints, restore, fork, exec transactions, diff and
// merge. It is built before the Manager, handed to it as an Extension
// (sandbox.Config.Extensions) and provisioned by it; no method may be
// called before. Its methods are safe for concurrent use: what orders
// operations on one sandbox is that sandbox's lock, taken through the
// core.
type Snapshots struct {
	ls  *layers.Store
	cs  store.CheckpointStore
	ids runtime.IDMap
	q   sandbox.Quotas
	ret Retention
	mem string // Config.MemoryDir
	log *slog.Logger
	sbx Sandboxes // set by Provision, before any hook runs

	prune pruner // the retention of implicit checkpoints (retention.go)
}

var (
	_ sandbox.Extension   = (*Snapshots)(nil)
	_ sandbox.Provisioner = (*Snapshots)(nil)
	_ sandbox.DeleteHook  = (*Snapshots)(nil)
	_ sandbox.PurgeHook   = (*Snapshots)(nil)
	_ sandbox.RescueHook  = (*Snapshots)(nil)
	_ io.Closer           = (*Snapshots)(nil)
)

// New returns Snapshots; the Manager provisions it.
func New(cfg Config) *Snapshots {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Snapshots{ls: cfg.Layers, cs: cfg.Checkpoints, ids: cfg.IDs, q: cfg.Quotas, ret: cfg.Retention, mem: cfg.MemoryDir, log: log,
		prune: pruner{pinned: map[string]int{}, stop: make(chan struct{})}}
}

// admitSandboxes admits n forks of owner, each with disk bytes of disk
// limit; the caller calls release once they exist or have failed.
func (m *Snapshots) admitSandboxes(ctx context.Context, owner string, n int, disk int64) (release func(), err error) {
	if m.q == nil {
		return func() {}, nil
	}
	_, release, err = m.q.AdmitSandboxes(ctx, tenant.Owner(owner), n, disk)
	return release, err
}

// admitLayer admits layer, just written for a checkpoint of owner; the
// caller calls release once it is recorded or dropped.
func (m *Snapshots) admitLayer(ctx context.Context, owner, layer string) (func(), error) {
	if m.q == nil {
		return func() {}, nil
	}
	return m.q.AdmitLayer(ctx, tenant.Owner(owner), layer)
}

// admitExec checks the CPU quota of the tenant owning sandbox id before
// a transaction's checkpoint is taken, as the core's Exec does before a
// process starts.
func (m *Snapshots) admitExec(ctx context.Context, id string) error {
	h, err := m.sbx.Handle(ctx, id)
	if err != nil {
		return err
	}
	if m.q == nil {
		return nil
	}
	if err := m.q.AdmitRun(ctx, tenant.Owner(h.Owner())); err != nil {
		return fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	return nil
}

// Name implements sandbox.Extension.
func (m *Snapshots) Name() string { return "snapshot" }

// Provision implements sandbox.Provisioner: c must be the whole core
// (Sandboxes), as *sandbox.Manager is.
func (m *Snapshots) Provision(c sandbox.Core) error {
	s, ok := c.(Sandboxes)
	if !ok {
		return errors.New("snapshot: the core does not offer checkpoints' API (LockRunning, CreateFork, ReadFS, ...)")
	}
	m.sbx = s
	return nil
}

// report shows an operation on sandbox id ("" for none) that started at
// start to the core's observers.
func (m *Snapshots) report(ctx context.Context, kind, id, detail string, start time.Time, err error) {
	m.sbx.Report(ctx, sandbox.Op{Kind: kind, Sandbox: id, Detail: detail, Err: err, Duration: time.Since(start)})
}

// OnPurgeTenant implements sandbox.PurgeHook: it deletes the checkpoints
// tenant owns (ctx acts as the tenant).
func (m *Snapshots) OnPurgeTenant(ctx context.Context, _ string) error {
	if _, _, err := m.checkpoints(); err != nil {
		return nil
	}
	var errs []error
	cks, err := m.ListCheckpoints(ctx, "")
	if err != nil {
		errs = append(errs, err)
	}
	for _, ck := range cks {
		if err := m.DeleteCheckpoint(ctx, ck.ID); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Rescue implements sandbox.RescueHook: sandbox h is restored to its
// newest checkpoint, when it has one.
func (m *Snapshots) Rescue(ctx context.Context, h *sandbox.Handle) (string, bool) {
	ck, ok := m.latestCheckpoint(ctx, h.ID())
	if !ok {
		return "", false
	}
	if err := m.restoreLocked(ctx, h, ck); err != nil {
		m.log.WarnContext(ctx, "restoring the latest checkpoint", "sandbox", h.ID(), "checkpoint", ck.Checkpoint.ID, "err", err)
		return "", false
	}
	return ck.Checkpoint.ID, true
}

// latestCheckpoint returns sandbox id's newest checkpoint.
func (m *Snapshots) latestCheckpoint(ctx context.Context, id string) (store.CheckpointRecord, bool) {
	cs, _, err := m.checkpoints()
	if err != nil {
		return store.CheckpointRecord{}, false
	}
	recs, err := cs.ListCheckpoints(ctx)
	if err != nil {
		return store.CheckpointRecord{}, false
	}
	var best store.CheckpointRecord
	found := false
	for _, r := range recs {
		if r.Checkpoint.SandboxID == id && (!found || r.Checkpoint.CreatedAt.After(best.Checkpoint.CreatedAt)) {
			best, found = r, true
		}
	}
	return best, found
}

// boundChain returns l, or a squash of l's chain when it is deeper than the
// store's MaxDepth. The unsquashed l is then removed unless something else
// uses it (the collector takes it otherwise).
func (m *Snapshots) boundChain(ctx context.Context, l layers.Layer) (layers.Layer, error) {
	sq, err := m.ls.Bound(ctx, l.ID, 0)
	if err != nil {
		return layers.Layer{}, fmt.Errorf("squashing layer chain: %w", err)
	}
	if sq.ID != l.ID {
		if err := m.ls.Remove(context.WithoutCancel(ctx), l.ID); err != nil && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) {
			m.log.WarnContext(ctx, "removing squashed layer", "layer", l.ID, "err", err)
		}
	}
	return sq, nil
}

// ExportCheckpoint returns the OCI image archive of checkpoint cid: its
// whole filesystem (template layers included); the caller closes it.
func (m *Snapshots) ExportCheckpoint(ctx context.Context, cid string) (io.ReadCloser, error) {
	_, ls, err := m.checkpoints()
	if err != nil {
		return nil, err
	}
	rec, err := m.checkpointRecord(ctx, cid)
	if err != nil {
		return nil, err
	}
	name := rec.Checkpoint.Name
	if name == "" || !imageNameRE.MatchString(name) {
		name = "checkpoint-" + rec.Checkpoint.ID
	}
	return oci.Export(ctx, ls, rec.Layer, oci.Image{Name: name, Env: rec.Env, Created: rec.Checkpoint.CreatedAt})
}

// imageNameRE is the name a template may have (sandbox's layerNameRE).
var imageNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
