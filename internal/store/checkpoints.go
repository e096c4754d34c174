package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
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
	TemplateID string    `json:"template_id,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
}

var _ CheckpointStore = (*Bolt)(nil)

// PutCheckpoint implements CheckpointStore.
func (b *Bolt) PutCheckpoint(ctx context.Context, rec CheckpointRecord) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("storing checkpoint: %w", err)
	}
	id := rec.Checkpoint.ID
	if id == "" {
		return fmt.Errorf("storing checkpoint: empty id: %w", errdefs.ErrInvalidArgument)
	}
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding checkpoint %s: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketCheckpoints)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), data)
	})
	if err != nil {
		return fmt.Errorf("storing checkpoint %s: %w", id, wrapDB(err))
	}
	return nil
}

// GetCheckpoint implements CheckpointStore.
func (b *Bolt) GetCheckpoint(ctx context.Context, id string) (CheckpointRecord, error) {
	if err := ctx.Err(); err != nil {
		return CheckpointRecord{}, fmt.Errorf("reading checkpoint %s: %w", id, err)
	}
	var (
		rec   CheckpointRecord
		found bool
	)
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketCheckpoints)
		if bk == nil {
			return nil
		}
		v := bk.Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decoding record: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	})
	if err != nil {
		return CheckpointRecord{}, fmt.Errorf("reading checkpoint %s: %w", id, wrapDB(err))
	}
	if !found {
		return CheckpointRecord{}, fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	return rec, nil
}

// ListCheckpoints implements CheckpointStore. Corrupt records are logged
// and skipped.
func (b *Bolt) ListCheckpoints(ctx context.Context) ([]CheckpointRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	recs := []CheckpointRecord{}
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketCheckpoints)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			var rec CheckpointRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				b.log.ErrorContext(ctx, "skipping corrupt checkpoint record", "id", string(k), "err", err)
				return nil
			}
			recs = append(recs, rec)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", wrapDB(err))
	}
	return recs, nil
}

// DeleteCheckpoint implements CheckpointStore.
func (b *Bolt) DeleteCheckpoint(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting checkpoint %s: %w", id, err)
	}
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketCheckpoints)
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("deleting checkpoint %s: %w", id, wrapDB(err))
	}
	return nil
}
