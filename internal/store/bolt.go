package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// DefaultOpenTimeout bounds how long Open waits for the file lock held by
// another process (a second daemon on the same data directory).
const DefaultOpenTimeout = time.Second

var (
	bucketSandboxes = []byte("sandboxes")
	bucketMeta      = []byte("meta")
	keySchema       = []byte("schema")
	schemaVersion   = []byte("1")
)

// Bolt is the embedded Store: one bbolt file holding one bucket of JSON
// records keyed by sandbox id. bbolt serialises writers itself, so Bolt
// needs no lock of its own; sandbox records are written in group commits
// (group.go).
type Bolt struct {
	db    *bolt.DB
	log   *slog.Logger
	group *groupCommit
}

var _ Store = (*Bolt)(nil)

// Option configures Open.
type Option func(*openOptions)

type openOptions struct {
	log     *slog.Logger
	timeout time.Duration
}

// WithLogger sets the logger used to report corrupt records.
func WithLogger(l *slog.Logger) Option { return func(o *openOptions) { o.log = l } }

// WithOpenTimeout overrides DefaultOpenTimeout.
func WithOpenTimeout(d time.Duration) Option { return func(o *openOptions) { o.timeout = d } }

// Open opens (creating if needed, mode 0600) the store file at path. Its
// parent directory is created 0700 if missing. When another process holds
// the file, Open fails after the open timeout with an error wrapping
// errdefs.ErrUnavailable instead of waiting forever.
func Open(path string, opts ...Option) (*Bolt, error) {
	o := openOptions{log: slog.New(slog.DiscardHandler), timeout: DefaultOpenTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating store directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.timeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("opening store %s: locked by another process (is another agentbox daemon using this data directory?): %w", path, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("opening store %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketSandboxes); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keySchema); v != nil && string(v) != string(schemaVersion) {
			return fmt.Errorf("store schema version %q, this build reads %q: %w", v, schemaVersion, errdefs.ErrFailedPrecondition)
		}
		return meta.Put(keySchema, schemaVersion)
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initialising store %s: %w", path, err)
	}
	return &Bolt{db: db, log: o.log, group: &groupCommit{db: db}}, nil
}

// Path returns the store file's path.
func (b *Bolt) Path() string { return b.db.Path() }

func wrapDB(err error) error {
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("store closed: %w", errdefs.ErrUnavailable)
	}
	return err
}

// PutSandbox implements Store.
func (b *Bolt) PutSandbox(ctx context.Context, rec SandboxRecord) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("storing sandbox: %w", err)
	}
	id := rec.Sandbox.ID
	if id == "" {
		return fmt.Errorf("storing sandbox: empty id: %w", errdefs.ErrInvalidArgument)
	}
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding sandbox %s: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	err = b.group.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(id), data)
	})
	if err != nil {
		return fmt.Errorf("storing sandbox %s: %w", id, wrapDB(err))
	}
	return nil
}

// GetSandbox implements Store.
func (b *Bolt) GetSandbox(ctx context.Context, id string) (SandboxRecord, error) {
	var rec SandboxRecord
	if err := b.getJSON(ctx, bucketSandboxes, id, &rec); err != nil {
		return SandboxRecord{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return rec, nil
}

// ListSandboxes implements Store. Corrupt records are logged at error level
// with their id and skipped.
func (b *Bolt) ListSandboxes(ctx context.Context) ([]SandboxRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	recs := []SandboxRecord{}
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			var rec SandboxRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				b.log.ErrorContext(ctx, "skipping corrupt sandbox record", "id", string(k), "err", err)
				return nil
			}
			recs = append(recs, rec)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", wrapDB(err))
	}
	return recs, nil
}

// DeleteSandbox implements Store.
func (b *Bolt) DeleteSandbox(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	err := b.group.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
	if err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, wrapDB(err))
	}
	return nil
}

// Close implements Store. It is safe to call more than once.
func (b *Bolt) Close() error {
	return b.db.Close()
}
