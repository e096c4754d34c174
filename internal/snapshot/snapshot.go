// Package snapshot compares and merges sandbox filesystems: the diff of two
// states (a sandbox, a checkpoint, a template), a sandbox's tree hash, and
// the three-way merge of one sandbox's changes into another. It sits above
// the sandbox core (internal/sandbox) and reaches sandboxes only through
// the core's API (ReadFS, CheckpointDirs, TemplateDirs and the Manager's
// checkpoint, restore and file calls); the core never imports it. See
// docs/EXTENSIONS.md.
package snapshot

import (
	"context"
	"io"
	"log/slog"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Sandboxes is what Snapshots needs of the sandbox core; *sandbox.Manager
// implements it.
type Sandboxes interface {
	// Handle and Report are the core's (sandbox.Core).
	Handle(ctx context.Context, id string) (*sandbox.Handle, error)
	Report(ctx context.Context, op sandbox.Op)
	// ReadFS, CheckpointDirs and TemplateDirs give the host directories
	// of a state (see internal/sandbox/core_snapshot.go).
	ReadFS(ctx context.Context, id string) (dirs []string, release func(), err error)
	CheckpointDirs(ctx context.Context, ref string) (api.Checkpoint, []string, error)
	TemplateDirs(ctx context.Context, name string) (string, []string, error)
	// Checkpoints, restore and file calls, as the API serves them.
	GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error)
	CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (api.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, cid string) error
	Restore(ctx context.Context, id, ref string) (api.RestoreResult, error)
	Remove(ctx context.Context, id, path string, recursive bool) error
	WriteArchive(ctx context.Context, id, path string, r io.Reader) error
}

var _ Sandboxes = (*sandbox.Manager)(nil)

// Config configures Snapshots.
type Config struct {
	// Sandboxes is the sandbox core.
	Sandboxes Sandboxes
	// IDs is the canonical host id range layers and upper dirs are owned
	// by on disk (sandbox.Config.IDs): files are shown with the ids the
	// sandbox sees.
	IDs    runtime.IDMap
	Logger *slog.Logger
}

// Snapshots serves diff, tree hash and merge. Its methods are safe for
// concurrent use; what orders them with other operations on a sandbox is
// the sandbox's operation lock, taken through the core.
type Snapshots struct {
	sbx Sandboxes
	ids runtime.IDMap
	log *slog.Logger
}

// New returns Snapshots over the core cfg.Sandboxes.
func New(cfg Config) *Snapshots {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Snapshots{sbx: cfg.Sandboxes, ids: cfg.IDs, log: log}
}
