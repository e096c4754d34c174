package store

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/api"
)

var bucketCheckpoints = []byte("checkpoints")

// CheckpointStore persists checkpoint records. It has the same guarantees
// as Store (safe for concurrent use, atomic and durable writes, errdefs
// categories); a Store that implements it supports checkpoints.
type CheckpointStore interface {
	// PutCheckpoint inserts or replaces the record rec.Checkpoint.ID.
	PutCheckpoint(ctx context.Context, rec CheckpointRecord) error
	// GetCheckpoint returns the record of id (errdefs.ErrNotFound).
	GetCheckpoint(ctx context.Context, id string) (CheckpointRecord, error)
	// ListCheckpoints returns every decodable record ordered by id.
	ListCheckpoints(ctx context.Context) ([]CheckpointRecord, error)
	// DeleteCheckpoint removes the record of id; a missing one is no error.
	DeleteCheckpoint(ctx context.Context, id string) error
}

// CheckpointRecord is everything the daemon keeps about one checkpoint.
type CheckpointRecord struct {
	// Checkpoint is what clients see.
	Checkpoint api.Checkpoint `json:"checkpoint"`
	// Layer is the ID of the checkpoint's own (top) layer; the record holds
	// a reference on it in the layer store.
	Layer string `json:"layer"`
	// Env and Resources are the source sandbox's, inherited by forks.
	Env       map[string]string `json:"env,omitempty"`
	Resources api.Resources     `json:"resources"`
	// TemplateID is the source sandbox's template id.
	TemplateID string `json:"template_id,omitempty"`
	// Backend is the source sandbox's isolation backend, which its forks
	// run on ("": the daemon's default, as for records before it).
	Backend string `json:"backend,omitempty"`
	// MemoryImage is the directory of a memory checkpoint's image
	// (api.Checkpoint.Memory), deleted with the checkpoint.
	MemoryImage string    `json:"memory_image,omitempty"`
	UpdatedAt   time.Time `json:"updated_at"`
}

var _ CheckpointStore = (*Bolt)(nil)

// PutCheckpoint implements CheckpointStore.
func (b *Bolt) PutCheckpoint(ctx context.Context, rec CheckpointRecord) error {
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	if err := b.putJSON(ctx, bucketCheckpoints, rec.Checkpoint.ID, rec); err != nil {
		return fmt.Errorf("storing checkpoint %s: %w", rec.Checkpoint.ID, err)
	}
	return nil
}

// GetCheckpoint implements CheckpointStore.
func (b *Bolt) GetCheckpoint(ctx context.Context, id string) (CheckpointRecord, error) {
	var rec CheckpointRecord
	if err := b.getJSON(ctx, bucketCheckpoints, id, &rec); err != nil {
		return CheckpointRecord{}, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return rec, nil
}

// ListCheckpoints implements CheckpointStore. Corrupt records are logged
// and skipped.
func (b *Bolt) ListCheckpoints(ctx context.Context) ([]CheckpointRecord, error) {
	recs, err := listJSON[CheckpointRecord](ctx, b, bucketCheckpoints)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	return recs, nil
}

// DeleteCheckpoint implements CheckpointStore.
func (b *Bolt) DeleteCheckpoint(ctx context.Context, id string) error {
	if err := b.deleteKey(ctx, bucketCheckpoints, id); err != nil {
		return fmt.Errorf("deleting checkpoint %s: %w", id, err)
	}
	return nil
}
