package api

import "time"

// Checkpoint is a saved, immutable state of a sandbox's filesystem: its
// writable layer captured as a read-only layer on top of the layers it ran
// on. Restoring or forking from it yields byte-identical files.
type Checkpoint struct {
	ID        string            `json:"id"`
	Tenant    string            `json:"tenant,omitempty"` // owner: the sandbox's tenant
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	SandboxID string            `json:"sandbox_id"` // the sandbox it was taken of (may be deleted since)
	Template  string            `json:"template"`
	// Layers is the layer chain, top-most first; Layers[0] holds the
	// sandbox's changes at checkpoint time.
	Layers    []string  `json:"layers"`
	SizeBytes int64     `json:"size_bytes"` // bytes of the checkpoint's own layer
	CreatedAt time.Time `json:"created_at"`
	// DurationMS is how long the sandbox was frozen while its state was
	// captured (set in the create response only).
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Implicit says why the daemon took the checkpoint on its own (exec,
	// fork or merge: its agentbox.implicit label); empty for one a user
	// asked for. Implicit checkpoints are pruned by the daemon's
	// retention (implicit_checkpoints_keep per sandbox,
	// implicit_checkpoints_max_age_seconds), except while a live sandbox
	// runs on one or was forked from it.
	Implicit string `json:"implicit,omitempty"`
	// Memory: the checkpoint holds the sandbox's memory and processes too
	// (CreateCheckpointRequest.Memory).
	Memory bool `json:"memory,omitempty"`
	// ExpiresAt is when an implicit checkpoint is pruned for its age, at
	// the latest (sooner when newer ones push it past the count); absent
	// without an age limit and for checkpoints users asked for.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// CheckpointList is the body of GET /v1/sandboxes/{id}/checkpoints.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// CreateCheckpointRequest is the body of POST /v1/sandboxes/{id}/checkpoints.
type CreateCheckpointRequest struct {
	Name   string            `json:"name,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Memory also captures the sandbox's memory and processes (backends
	// with the memory-checkpoint capability: gvisor): a restore or fork
	// of it continues the processes where they were. The sandbox must be
	// running; it keeps running.
	Memory bool `json:"memory,omitempty"`
	// AllowSecretsInMemory lets a memory checkpoint be taken while a
	// process started with secrets or a run token (a private exec) still
	// runs, or once the sandbox's guest has started one (the guest, which
	// was given them, may still hold them): that memory, secrets
	// included, is then in the image and in every fork of it. Without it
	// such a checkpoint is refused (failed_precondition); a restore from
	// a filesystem checkpoint gives the sandbox a fresh guest.
	AllowSecretsInMemory bool `json:"allow_secrets_in_memory,omitempty"`
}

// RestoreRequest is the body of POST /v1/sandboxes/{id}/restore.
type RestoreRequest struct {
	Checkpoint string `json:"checkpoint"` // id or name of one of the sandbox's checkpoints
}

// RestoreResult is the response of POST /v1/sandboxes/{id}/restore.
type RestoreResult struct {
	Sandbox    Sandbox `json:"sandbox"`
	Checkpoint string  `json:"checkpoint"`  // id of the checkpoint restored
	DurationMS int64   `json:"duration_ms"` // time from stop to the guest answering again
}

// ForkRequest is the body of POST /v1/checkpoints/{cid}/fork and
// POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count  int               `json:"count,omitempty"`  // default 1
	Labels map[string]string `json:"labels,omitempty"` // labels of every fork
	Env    map[string]string `json:"env,omitempty"`    // merged over the source sandbox's env
}

// ForkResult is the response of the fork routes.
type ForkResult struct {
	Checkpoint string    `json:"checkpoint"` // the checkpoint the forks start from
	Sandboxes  []Sandbox `json:"sandboxes"`
}
