package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

var bucketQuarantine = []byte("quarantine")

// Quarantiner is implemented by stores that can set corrupt records
// aside. The daemon calls QuarantineCorrupt once at start-up, before it
// reconciles its records with the host, so that one bad record neither
// stops it from starting nor is silently forgotten.
type Quarantiner interface {
	// QuarantineCorrupt moves every sandbox and checkpoint record that
	// cannot be decoded, or whose id does not match its key, into the
	// quarantine bucket in one atomic transaction, and returns what it
	// moved.
	QuarantineCorrupt(ctx context.Context) ([]QuarantinedRecord, error)
	// ListQuarantine returns every quarantined record, oldest first.
	ListQuarantine(ctx context.Context) ([]QuarantinedRecord, error)
}

// QuarantinedRecord is a record set aside as corrupt, kept verbatim for
// inspection.
type QuarantinedRecord struct {
	// Bucket is where it was ("sandboxes" or "checkpoints"), Key its key.
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Reason says why it was set aside.
	Reason string `json:"reason"`
	// Raw is the record's bytes as they were stored.
	Raw []byte    `json:"raw"`
	At  time.Time `json:"at"`
}

var _ Quarantiner = (*Bolt)(nil)

// QuarantineCorrupt implements Quarantiner.
func (b *Bolt) QuarantineCorrupt(ctx context.Context) ([]QuarantinedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("quarantining records: %w", err)
	}
	var moved []QuarantinedRecord
	now := time.Now().UTC()
	err := b.db.Update(func(tx *bolt.Tx) error {
		moved = moved[:0]
		q, err := tx.CreateBucketIfNotExists(bucketQuarantine)
		if err != nil {
			return err
		}
		for _, name := range [][]byte{bucketSandboxes, bucketCheckpoints} {
			bk := tx.Bucket(name)
			if bk == nil {
				continue
			}
			var bad []QuarantinedRecord
			err := bk.ForEach(func(k, v []byte) error {
				if reason := checkRecord(name, k, v); reason != "" {
					bad = append(bad, QuarantinedRecord{
						Bucket: string(name), Key: string(k), Reason: reason,
						Raw: append([]byte(nil), v...), At: now,
					})
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, r := range bad {
				data, err := json.Marshal(r)
				if err != nil {
					return err
				}
				qk := fmt.Sprintf("%s/%s/%s", now.Format(time.RFC3339Nano), r.Bucket, r.Key)
				if err := q.Put([]byte(qk), data); err != nil {
					return err
				}
				if err := bk.Delete([]byte(r.Key)); err != nil {
					return err
				}
			}
			moved = append(moved, bad...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("quarantining records: %w", wrapDB(err))
	}
	for _, r := range moved {
		b.log.ErrorContext(ctx, "quarantined corrupt record", "bucket", r.Bucket, "key", r.Key, "reason", r.Reason)
	}
	return moved, nil
}

// checkRecord returns why the record k=v of bucket is corrupt, or "".
func checkRecord(bucket, k, v []byte) string {
	var id string
	switch string(bucket) {
	case string(bucketSandboxes):
		var rec SandboxRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return "undecodable: " + err.Error()
		}
		id = rec.Sandbox.ID
	case string(bucketCheckpoints):
		var rec CheckpointRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return "undecodable: " + err.Error()
		}
		id = rec.Checkpoint.ID
	}
	if id != string(k) {
		return fmt.Sprintf("record id %q under key %q", id, k)
	}
	return ""
}

// ListQuarantine implements Quarantiner.
func (b *Bolt) ListQuarantine(ctx context.Context) ([]QuarantinedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing quarantine: %w", err)
	}
	out := []QuarantinedRecord{}
	err := b.db.View(func(tx *bolt.Tx) error {
		q := tx.Bucket(bucketQuarantine)
		if q == nil {
			return nil
		}
		return q.ForEach(func(_, v []byte) error {
			var r QuarantinedRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return nil
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing quarantine: %w", wrapDB(err))
	}
	return out, nil
}
