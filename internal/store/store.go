// Package store persists the daemon's sandbox metadata so that a restarted
// daemon can re-adopt or reap every sandbox it created.
//
// The contract is the Store interface; Bolt is the embedded implementation
// (a single bbolt file under the data directory). The manager
// (internal/sandbox) is the only writer.
package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Store is the sandbox metadata store.
//
// All methods are safe for concurrent use. Every write is atomic and durable
// when it returns nil: after a crash, a record is either the old or the new
// version, never a mix. Methods return ctx.Err() (wrapped) when ctx is done
// before the operation starts; an operation that has started is not
// interrupted. Errors wrap errdefs sentinels: ErrNotFound, ErrInvalidArgument,
// ErrUnavailable (store closed or locked by another process) and ErrInternal
// (corrupt data).
type Store interface {
	// PutSandbox inserts rec or replaces the record with the same
	// rec.Sandbox.ID. An empty ID is ErrInvalidArgument. UpdatedAt is set by
	// the store when zero.
	PutSandbox(ctx context.Context, rec SandboxRecord) error
	// GetSandbox returns the record of id, or an error wrapping
	// errdefs.ErrNotFound. A record that cannot be decoded is ErrInternal.
	GetSandbox(ctx context.Context, id string) (SandboxRecord, error)
	// ListSandboxes returns every decodable record, ordered by id. Records
	// that cannot be decoded are skipped and logged, never fatal: one bad
	// record must not keep the daemon from starting.
	ListSandboxes(ctx context.Context) ([]SandboxRecord, error)
	// DeleteSandbox removes the record of id. Deleting a missing record is
	// not an error.
	DeleteSandbox(ctx context.Context, id string) error
	// Close releases the store. Calls after Close fail with ErrUnavailable.
	Close() error
}

// SandboxRecord is everything the daemon must remember about one sandbox.
type SandboxRecord struct {
	// Sandbox is what clients see.
	Sandbox api.Sandbox `json:"sandbox"`
	// RuntimeState is opaque backend state from runtime.Sandbox.State(),
	// handed back to the backend on re-adoption.
	RuntimeState []byte `json:"runtime_state,omitempty"`
	// Layers are the overlay lower directories, top-most first.
	Layers     []string `json:"layers,omitempty"`
	UpperDir   string   `json:"upper_dir,omitempty"`
	WorkDir    string   `json:"work_dir,omitempty"`
	SocketPath string   `json:"socket_path,omitempty"`
	StateDir   string   `json:"state_dir,omitempty"`
	// Spec is free-form extra data the manager needs to re-adopt.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Transitions are the sandbox's newest state changes, oldest first.
	Transitions []api.Transition `json:"transitions,omitempty"`
	// TTLLeft is what was left of the hard lifetime when the sandbox went
	// to sleep (paused or hibernated time does not count against it).
	TTLLeft time.Duration `json:"ttl_left,omitempty"`
	// UpdatedAt is the time of the last PutSandbox.
	UpdatedAt time.Time `json:"updated_at"`
}
