package store

import (
	"context"
	"fmt"
	"time"
)

var bucketExposures = []byte("exposures")

// ExposureStore persists the exposures of service URLs
// (internal/serviceurl), so that tokens survive a daemon restart and a
// revocation stays revoked. Same guarantees as Store.
type ExposureStore interface {
	// PutExposure inserts or replaces the record rec.ID.
	PutExposure(ctx context.Context, rec ExposureRecord) error
	// ListExposures returns every decodable record ordered by id.
	ListExposures(ctx context.Context) ([]ExposureRecord, error)
	// DeleteExposure removes the record of id; a missing one is no error.
	DeleteExposure(ctx context.Context, id string) error
}

// ExposureRecord is one exposed port of a sandbox. The token is not
// stored: it is an HMAC of these fields under a key kept outside the data
// directory, recomputed when a request presents one.
type ExposureRecord struct {
	ID        string    `json:"id"`
	Sandbox   string    `json:"sandbox"`
	Port      int       `json:"port"`
	Tenant    string    `json:"tenant"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

var _ ExposureStore = (*Bolt)(nil)

// PutExposure implements ExposureStore.
func (b *Bolt) PutExposure(ctx context.Context, rec ExposureRecord) error {
	if err := b.putJSON(ctx, bucketExposures, rec.ID, rec); err != nil {
		return fmt.Errorf("storing exposure %s: %w", rec.ID, err)
	}
	return nil
}

// ListExposures implements ExposureStore.
func (b *Bolt) ListExposures(ctx context.Context) ([]ExposureRecord, error) {
	recs, err := listJSON[ExposureRecord](ctx, b, bucketExposures)
	if err != nil {
		return nil, fmt.Errorf("listing exposures: %w", err)
	}
	return recs, nil
}

// DeleteExposure implements ExposureStore.
func (b *Bolt) DeleteExposure(ctx context.Context, id string) error {
	if err := b.deleteKey(ctx, bucketExposures, id); err != nil {
		return fmt.Errorf("deleting exposure %s: %w", id, err)
	}
	return nil
}
