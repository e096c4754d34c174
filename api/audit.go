package api

import "time"

// The flight recorder: one event model for everything a sandbox did
// (docs/AUDIT.md). Every event is an SandboxEvent (api/secrets.go) of one
// of the types below, with the structured part its type names; the bridge's
// log, metric and usage events and the core's oom events are recorded the
// same way. GET /v1/sandboxes/{id}/events lists and follows them.

// Event types of the flight recorder.
const (
	// A command started (Run: command, cwd, user, actor) and ended (Run:
	// exit code or signal, duration, output digest and redacted excerpt).
	EventRunStarted = "run.started"
	EventRunEnded   = "run.ended"
	// A file the run changed in the sandbox's writable layer (File),
	// computed on the host from that layer before and after the run.
	EventFileChanged = "file.changed"
	// A decision of the egress proxy (Egress), linked to its run when it
	// could be attributed.
	EventNetwork = "network"
	// A package the run installed or removed (Package).
	EventPackage = "package"
	// A state transition of the sandbox (Transition, Cause).
	EventTransition = "transition"
	// Operations on the sandbox as a whole (Detail: the checkpoint's
	// name or id, the template's name; Error when it failed).
	EventCreate           = "create"
	EventDelete           = "delete"
	EventCheckpoint       = "checkpoint"
	EventRestore          = "restore"
	EventFork             = "fork"
	EventMerge            = "merge"
	EventUpgrade          = "upgrade"
	EventSaveTemplate     = "save_template"
	EventDeleteCheckpoint = "delete_checkpoint"
	// A call through the files and processes API that changed something
	// (Detail: "writing /path", "removing /path", "signalling process
	// 12", ...).
	EventGuestCall = "guest_call"
	// Events were not recorded because the sandbox's record reached its
	// bound (Dropped).
	EventDropped = "dropped"
)

// RunEvent describes one command (types run.started, run.ended).
type RunEvent struct {
	Command string `json:"command,omitempty"`
	// Args is the argv of a run asked for as cmd (Command is then its
	// words joined by spaces, which loses quoting); absent for a shell
	// command line or when it was longer than the record keeps. What a
	// replay re-runs.
	Args []string `json:"args,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	User string   `json:"user,omitempty"`
	// Mode is "foreground" or "background".
	Mode string `json:"mode,omitempty"`
	// Credentials are the names of the stored secrets put in the run's
	// environment (never their values).
	Credentials []string `json:"credentials,omitempty"`
	// TraceParent is the caller's W3C trace context (the exec request's
	// traceparent header): the run's span is its child.
	TraceParent string `json:"traceparent,omitempty"`
	// Set on run.ended.
	ExitCode   *int    `json:"exit_code,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	OOMKilled  bool    `json:"oom_killed,omitempty"`
	Outcome    string  `json:"outcome,omitempty"`
	DurationMS float64 `json:"duration_ms,omitempty"`
	// OutputBytes counts stdout and stderr; OutputSHA256 is the digest of
	// the output as the caller received it (redacted), stdout and stderr
	// interleaved as they arrived; Excerpt is its first bytes (bounded,
	// redacted).
	OutputBytes    int64  `json:"output_bytes,omitempty"`
	OutputSHA256   string `json:"output_sha256,omitempty"`
	Excerpt        string `json:"excerpt,omitempty"`
	ExcerptTrimmed bool   `json:"excerpt_trimmed,omitempty"`
	// CPUSeconds is the CPU time the sandbox used during the run, when
	// the backend reports it.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	// FilesOmitted counts file changes not recorded as events (beyond the
	// per-run bound); FilesTruncated says the writable layer had more
	// entries than are compared, so changes may be missing.
	FilesOmitted   int  `json:"files_omitted,omitempty"`
	FilesTruncated bool `json:"files_truncated,omitempty"`
}

// EventQuery selects events of GET /v1/sandboxes/{id}/events (query
// parameters type (repeated or comma-separated), run, since, until
// (RFC 3339), after (a sequence number) and limit).
type EventQuery struct {
	Types []string  `json:"types,omitempty"`
	Run   string    `json:"run,omitempty"`
	Since time.Time `json:"since,omitempty"`
	Until time.Time `json:"until,omitempty"`
	// After selects events with a sequence number above it.
	After uint64 `json:"after,omitempty"`
	// Limit keeps the first Limit events selected (0: all).
	Limit int `json:"limit,omitempty"`
}

// Match reports whether ev is selected by q (Limit aside).
func (q EventQuery) Match(ev SandboxEvent) bool {
	if ev.Seq <= q.After && q.After > 0 {
		return false
	}
	if q.Run != "" && ev.RunID != q.Run {
		return false
	}
	if !q.Since.IsZero() && ev.Time.Before(q.Since) {
		return false
	}
	if !q.Until.IsZero() && ev.Time.After(q.Until) {
		return false
	}
	if len(q.Types) == 0 {
		return true
	}
	for _, t := range q.Types {
		// "run" selects run.started and run.ended.
		if t == ev.Type || (len(t) < len(ev.Type) && ev.Type[:len(t)] == t && ev.Type[len(t)] == '.') {
			return true
		}
	}
	return false
}

// File change kinds (FileEvent.Change).
const (
	FileCreated  = "created"
	FileModified = "modified"
	FileDeleted  = "deleted"
)

// FileEvent is one file a run changed (type file.changed).
type FileEvent struct {
	Path   string `json:"path"`
	Change string `json:"change"`
	// Kind is "file", "dir", "symlink" or "other".
	Kind string `json:"kind,omitempty"`
	Size int64  `json:"size,omitempty"`
	Mode string `json:"mode,omitempty"`
	// SHA256 is the content's digest (regular files up to the recorder's
	// hashing bound; "" beyond it, with Size still set).
	SHA256 string `json:"sha256,omitempty"`
	Target string `json:"target,omitempty"` // symlink target
}

// PackageEvent is one package a run installed or removed (type package).
type PackageEvent struct {
	// Manager is "dpkg", "pip", "npm" or "apk".
	Manager string `json:"manager"`
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// Action is "installed" or "removed".
	Action string `json:"action"`
}

// DroppedEvents says how many events were not recorded, and since when
// (type dropped).
type DroppedEvents struct {
	Count int64     `json:"count"`
	Since time.Time `json:"since"`
}

// AuditVerifyResult is the body of GET /v1/sandboxes/{id}/audit/verify and
// one entry of GET /v1/audit/verify.
type AuditVerifyResult struct {
	SandboxID string `json:"sandbox_id"`
	// OK says the record is intact: every record's hash and link are
	// right, sequence numbers follow each other, and the last signed head
	// is present with the same hash.
	OK      bool   `json:"ok"`
	Events  uint64 `json:"events"`
	Head    string `json:"head,omitempty"`
	Signed  uint64 `json:"signed_seq,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
	// Problem names the first problem found (the record's line and what
	// is wrong).
	Problem string `json:"problem,omitempty"`
}

// AuditVerifyList is the body of GET /v1/audit/verify.
type AuditVerifyList struct {
	Results []AuditVerifyResult `json:"results"`
}
