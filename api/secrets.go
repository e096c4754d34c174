package api

import "time"

// SecretInfo describes a stored secret. The value is write-only: no route
// ever returns it.
type SecretInfo struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretList is the body of GET /v1/secrets.
type SecretList struct {
	Secrets []SecretInfo `json:"secrets"`
}

// PutSecretRequest is the JSON form of the body of PUT /v1/secrets/{name}
// (sent with Content-Type: application/json). Any other content type is
// taken as the raw value.
type PutSecretRequest struct {
	Value string `json:"value"`
}

// ExecSecret asks for a stored secret to be placed in the environment of one
// exec's process (and nowhere else): variable Env, default Name.
type ExecSecret struct {
	Name string `json:"name"`
	Env  string `json:"env,omitempty"`
}

// RunTokenEnv is the environment variable holding a run's bridge token
// (ExecRequest.Token).
const RunTokenEnv = "AGENTBOX_RUN_TOKEN"

// BridgeAddr is the address of the API bridge inside every sandbox.
const BridgeAddr = "127.0.0.1:3129"

// Sandbox event types, posted from inside a sandbox to the bridge's
// POST /v1/events and listed by GET /v1/sandboxes/{id}/events.
const (
	SandboxEventLog    = "log"
	SandboxEventMetric = "metric"
	SandboxEventUsage  = "usage"
)

// SandboxEvent is one record sent from inside a sandbox through the bridge.
// Time, SandboxID and RunID are set by the daemon from the verified token,
// never taken from the sender.
type SandboxEvent struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id"`
	RunID     string    `json:"run_id"`
	Type      string    `json:"type"`
	// Message is a log line (type log).
	Message string `json:"message,omitempty"`
	// Name and Value are a metric or usage figure (types metric, usage).
	Name  string  `json:"name,omitempty"`
	Value float64 `json:"value,omitempty"`
	// Attrs are free-form string attributes.
	Attrs map[string]string `json:"attrs,omitempty"`

	// The fields below are the flight recorder's (api/audit.go): every
	// event of a sandbox, not only the bridge's, has a sequence number in
	// the sandbox's hash-chained record and at most one of the structured
	// parts, as its Type says.

	// Seq numbers the sandbox's recorded events from 1, in order.
	Seq uint64 `json:"seq,omitempty"`
	// Tenant owns the sandbox; Actor is who asked for the operation
	// (tenant, or tenant/key id for a tenant's API key).
	Tenant string `json:"tenant,omitempty"`
	Actor  string `json:"actor,omitempty"`
	// Cause and Detail say why and on what an operation happened (a
	// transition's cause, a checkpoint's name).
	Cause  string `json:"cause,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Error is how the operation failed ("" when it succeeded).
	Error      string         `json:"error,omitempty"`
	Run        *RunEvent      `json:"run,omitempty"`
	File       *FileEvent     `json:"file,omitempty"`
	Egress     *EgressRecord  `json:"egress,omitempty"`
	Package    *PackageEvent  `json:"package,omitempty"`
	Transition *Transition    `json:"transition,omitempty"`
	Dropped    *DroppedEvents `json:"dropped,omitempty"`
}

// SandboxEventList is the body of GET /v1/sandboxes/{id}/events.
type SandboxEventList struct {
	Events []SandboxEvent `json:"events"`
}

// BridgeEvent is the body of the bridge's POST /v1/events: a SandboxEvent
// without the fields the daemon sets itself.
type BridgeEvent struct {
	Type    string            `json:"type"`
	Message string            `json:"message,omitempty"`
	Name    string            `json:"name,omitempty"`
	Value   float64           `json:"value,omitempty"`
	Attrs   map[string]string `json:"attrs,omitempty"`
}
