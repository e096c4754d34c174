package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

var (
	bucketRuns      = []byte("runs")
	bucketSchedules = []byte("schedules")
	bucketHooks     = []byte("hooks")
)

// PipelineStore persists the execution pipeline's run records and its
// triggers (schedules, webhooks). It has the same guarantees as Store
// (safe for concurrent use, atomic and durable writes, errdefs categories,
// corrupt records skipped and logged by the List methods).
type PipelineStore interface {
	// PutRun inserts or replaces the run record run.ID. Run ids sort in
	// the order the runs started (see internal/pipeline), which ListRuns
	// relies on for newest-first order.
	PutRun(ctx context.Context, run api.Run) error
	// PutRuns inserts or replaces the records runs in one durable commit.
	PutRuns(ctx context.Context, runs []api.Run) error
	// GetRun returns the run record of id (errdefs.ErrNotFound).
	GetRun(ctx context.Context, id string) (api.Run, error)
	// ListRuns returns the records matching f, newest first.
	ListRuns(ctx context.Context, f RunFilter) ([]api.Run, error)
	// PruneRuns deletes the oldest records beyond the newest keep.
	PruneRuns(ctx context.Context, keep int) error
	// DeleteRuns deletes every record matching f (Limit aside) in one
	// durable commit and returns how many it deleted.
	DeleteRuns(ctx context.Context, f RunFilter) (int, error)

	PutSchedule(ctx context.Context, s api.Schedule) error
	GetSchedule(ctx context.Context, id string) (api.Schedule, error)
	ListSchedules(ctx context.Context) ([]api.Schedule, error)
	DeleteSchedule(ctx context.Context, id string) error

	PutHook(ctx context.Context, h HookRecord) error
	GetHook(ctx context.Context, id string) (HookRecord, error)
	ListHooks(ctx context.Context) ([]HookRecord, error)
	DeleteHook(ctx context.Context, id string) error
}

// RunFilter selects run records; zero fields match everything.
type RunFilter struct {
	// Tenant keeps the runs of one tenant ("admin" also matches records
	// without a tenant).
	Tenant  string
	Sandbox string
	Trigger string
	// Since keeps runs started at or after it.
	Since time.Time
	// Limit caps the number of records (0: no cap).
	Limit int
}

// Match reports whether r passes f (Limit aside).
func (f RunFilter) Match(r api.Run) bool {
	return (f.Tenant == "" || r.Tenant == f.Tenant || (r.Tenant == "" && f.Tenant == api.AdminTenant)) &&
		(f.Sandbox == "" || r.Sandbox == f.Sandbox) &&
		(f.Trigger == "" || r.Trigger == f.Trigger) &&
		(f.Since.IsZero() || !r.StartedAt.Before(f.Since))
}

// HookRecord is a webhook and its signing secret, sealed by the pipeline
// (the store never sees the plaintext).
type HookRecord struct {
	Hook         api.Hook `json:"hook"`
	SealedSecret []byte   `json:"sealed_secret"`
}

var _ PipelineStore = (*Bolt)(nil)

// putJSON stores v under key in bucket (created on first use), durably,
// in a group commit shared with concurrent single-record writes.
func (b *Bolt) putJSON(ctx context.Context, bucket []byte, key string, v any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("empty id: %w", errdefs.ErrInvalidArgument)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	// One record: it goes out in a group commit with concurrent writes.
	return wrapDB(b.group.update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		return bk.Put([]byte(key), data)
	}))
}

// getJSON decodes the record key of bucket into v (ErrNotFound when
// missing, ErrInternal when corrupt).
func (b *Bolt) getJSON(ctx context.Context, bucket []byte, key string, v any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	found := false
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		if bk == nil {
			return nil
		}
		data := bk.Get([]byte(key))
		if data == nil {
			return nil
		}
		found = true
		if err := json.Unmarshal(data, v); err != nil {
			return fmt.Errorf("decoding record: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	})
	if err != nil {
		return wrapDB(err)
	}
	if !found {
		return errdefs.ErrNotFound
	}
	return nil
}

// listJSON decodes every record of bucket in key order; corrupt ones are
// logged and skipped.
func listJSON[T any](ctx context.Context, b *Bolt, bucket []byte) ([]T, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := []T{}
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			var rec T
			if err := json.Unmarshal(v, &rec); err != nil {
				b.log.ErrorContext(ctx, "skipping corrupt record", "bucket", string(bucket), "id", string(k), "err", err)
				return nil
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, wrapDB(err)
}

func (b *Bolt) deleteKey(ctx context.Context, bucket []byte, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return wrapDB(b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(key))
	}))
}

// PutRun implements PipelineStore.
func (b *Bolt) PutRun(ctx context.Context, run api.Run) error {
	if err := b.putJSON(ctx, bucketRuns, run.ID, run); err != nil {
		return fmt.Errorf("storing run %s: %w", run.ID, err)
	}
	return nil
}

// PutRuns implements PipelineStore.
func (b *Bolt) PutRuns(ctx context.Context, runs []api.Run) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys := make([][]byte, len(runs))
	vals := make([][]byte, len(runs))
	for i, run := range runs {
		if run.ID == "" {
			return fmt.Errorf("storing runs: empty id: %w", errdefs.ErrInvalidArgument)
		}
		data, err := json.Marshal(run)
		if err != nil {
			return fmt.Errorf("storing run %s: encoding: %v: %w", run.ID, err, errdefs.ErrInvalidArgument)
		}
		keys[i], vals[i] = []byte(run.ID), data
	}
	err := b.group.update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucketRuns)
		if err != nil {
			return err
		}
		for i := range keys {
			if err := bk.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storing %d runs: %w", len(runs), wrapDB(err))
	}
	return nil
}

// GetRun implements PipelineStore.
func (b *Bolt) GetRun(ctx context.Context, id string) (api.Run, error) {
	var r api.Run
	if err := b.getJSON(ctx, bucketRuns, id, &r); err != nil {
		return api.Run{}, fmt.Errorf("run %s: %w", id, err)
	}
	return r, nil
}

// ListRuns implements PipelineStore: it walks the runs bucket from its
// newest key back and stops at Limit, or at the first run older than
// Since (keys sort by start time).
func (b *Bolt) ListRuns(ctx context.Context, f RunFilter) ([]api.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	out := []api.Run{}
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRuns)
		if bk == nil {
			return nil
		}
		c := bk.Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			var r api.Run
			if err := json.Unmarshal(v, &r); err != nil {
				b.log.ErrorContext(ctx, "skipping corrupt run record", "id", string(k), "err", err)
				continue
			}
			if !f.Since.IsZero() && r.StartedAt.Before(f.Since) {
				break
			}
			if !f.Match(r) {
				continue
			}
			out = append(out, r)
			if f.Limit > 0 && len(out) >= f.Limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing runs: %w", wrapDB(err))
	}
	return out, nil
}

// PruneRuns implements PipelineStore.
func (b *Bolt) PruneRuns(ctx context.Context, keep int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pruning runs: %w", err)
	}
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRuns)
		if bk == nil {
			return nil
		}
		n := bk.Stats().KeyN
		if n <= keep {
			return nil
		}
		var drop [][]byte
		c := bk.Cursor()
		for k, _ := c.First(); k != nil && len(drop) < n-keep; k, _ = c.Next() {
			drop = append(drop, bytes.Clone(k))
		}
		for _, k := range drop {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pruning runs: %w", wrapDB(err))
	}
	return nil
}

// DeleteRuns implements PipelineStore.
func (b *Bolt) DeleteRuns(ctx context.Context, f RunFilter) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("deleting runs: %w", err)
	}
	n := 0
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketRuns)
		if bk == nil {
			return nil
		}
		var drop [][]byte
		err := bk.ForEach(func(k, v []byte) error {
			var r api.Run
			if json.Unmarshal(v, &r) == nil && f.Match(r) {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		n = len(drop)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("deleting runs: %w", wrapDB(err))
	}
	return n, nil
}

// PutSchedule implements PipelineStore.
func (b *Bolt) PutSchedule(ctx context.Context, s api.Schedule) error {
	if err := b.putJSON(ctx, bucketSchedules, s.ID, s); err != nil {
		return fmt.Errorf("storing schedule %s: %w", s.ID, err)
	}
	return nil
}

// GetSchedule implements PipelineStore.
func (b *Bolt) GetSchedule(ctx context.Context, id string) (api.Schedule, error) {
	var s api.Schedule
	if err := b.getJSON(ctx, bucketSchedules, id, &s); err != nil {
		return api.Schedule{}, fmt.Errorf("schedule %s: %w", id, err)
	}
	return s, nil
}

// ListSchedules implements PipelineStore (ordered by id).
func (b *Bolt) ListSchedules(ctx context.Context) ([]api.Schedule, error) {
	out, err := listJSON[api.Schedule](ctx, b, bucketSchedules)
	if err != nil {
		return nil, fmt.Errorf("listing schedules: %w", err)
	}
	return out, nil
}

// DeleteSchedule implements PipelineStore; a missing one is no error.
func (b *Bolt) DeleteSchedule(ctx context.Context, id string) error {
	if err := b.deleteKey(ctx, bucketSchedules, id); err != nil {
		return fmt.Errorf("deleting schedule %s: %w", id, err)
	}
	return nil
}

// PutHook implements PipelineStore.
func (b *Bolt) PutHook(ctx context.Context, h HookRecord) error {
	if err := b.putJSON(ctx, bucketHooks, h.Hook.ID, h); err != nil {
		return fmt.Errorf("storing hook %s: %w", h.Hook.ID, err)
	}
	return nil
}

// GetHook implements PipelineStore.
func (b *Bolt) GetHook(ctx context.Context, id string) (HookRecord, error) {
	var h HookRecord
	if err := b.getJSON(ctx, bucketHooks, id, &h); err != nil {
		return HookRecord{}, fmt.Errorf("hook %s: %w", id, err)
	}
	return h, nil
}

// ListHooks implements PipelineStore (ordered by id).
func (b *Bolt) ListHooks(ctx context.Context) ([]HookRecord, error) {
	out, err := listJSON[HookRecord](ctx, b, bucketHooks)
	if err != nil {
		return nil, fmt.Errorf("listing hooks: %w", err)
	}
	return out, nil
}

// DeleteHook implements PipelineStore; a missing one is no error.
func (b *Bolt) DeleteHook(ctx context.Context, id string) error {
	if err := b.deleteKey(ctx, bucketHooks, id); err != nil {
		return fmt.Errorf("deleting hook %s: %w", id, err)
	}
	return nil
}
