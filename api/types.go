// Package api holds the wire types of the agentbox HTTP API v1 and its
// OpenAPI description. It is imported by the daemon (internal/httpapi) and by
// the Go SDK (sdk/go), so the two can never drift apart. It has no logic and
// imports nothing from internal/.
//
// Conventions: JSON field names are snake_case; times are RFC 3339; byte
// payloads inside JSON (exec output, stdin) are base64 ([]byte fields).
package api

import (
	"encoding/json"
	"time"
)

// Version is the API version spoken by this build. Clients send it in the
// VersionHeader; the daemon answers with its own.
const Version = "v1"

// Headers used on every request or response.
const (
	// VersionHeader carries the client's and the daemon's agentbox version.
	VersionHeader = "Agentbox-Version"
	// RequestIDHeader carries the id that also appears in the daemon's log
	// line and in any error body for that request.
	RequestIDHeader = "X-Request-Id"
)

// Error is the body of every non-2xx response.
type Error struct {
	Code      string `json:"code"`       // stable category: "not_found", "invalid_argument", ...
	Message   string `json:"message"`    // human-readable, safe to show; never internal detail
	RequestID string `json:"request_id"` // matches the daemon's log line
	// Reason refines Code where clients act on it: "command_not_found"
	// (exec of an executable that does not exist; the CLI exits 127),
	// "command_not_executable" (exists but cannot be run; 126).
	Reason string `json:"reason,omitempty"`
}

// Resources are the limits applied to a sandbox's cgroup. Zero means the
// daemon's default.
type Resources struct {
	CPUs        float64 `json:"cpus,omitempty"`         // cores, e.g. 0.5 or 2
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // hard limit, no swap
	PidsMax     int64   `json:"pids_max,omitempty"`     // processes+threads
	// Disk and open-files limits: api/limits.go.
	DiskBytes  int64 `json:"disk_bytes,omitempty"`  // writable layer size; 0: the default (Info.DefaultDiskBytes)
	DiskInodes int64 `json:"disk_inodes,omitempty"` // writable layer inodes; 0: the default, scaled to disk_bytes
	OpenFiles  int64 `json:"open_files,omitempty"`  // RLIMIT_NOFILE of every process
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Template       string            `json:"template,omitempty"` // default "busybox"
	Env            map[string]string `json:"env,omitempty"`      // default environment of every exec
	Labels         map[string]string `json:"labels,omitempty"`
	Resources      Resources         `json:"resources,omitempty"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty"` // hard lifetime; 0 = none
	Hostname       string            `json:"hostname,omitempty"`
	Network        *NetworkSpec      `json:"network,omitempty"` // default mode "none"; see api/network.go
	// Name is unique among the tenant's live sandboxes and is accepted
	// wherever an id is; it must not have the shape of an id (12
	// characters of [a-z0-9]). Creating a sandbox with the name of an
	// existing one returns that one (woken; 200 instead of 201), unless
	// the request explicitly asks for options it does not have: then
	// ErrConflict (409) naming each option that differs.
	Name      string      `json:"name,omitempty"`
	Lifecycle string      `json:"lifecycle,omitempty"` // "session" (default) or "persistent"; see api/lifecycle.go
	Idle      *IdlePolicy `json:"idle,omitempty"`      // overrides of the preset's idle policy
	// Runtime names the isolation backend to run on (Info.Backends);
	// default: the daemon's (--runtime). An unknown one is 400. The
	// sandbox reports it as Sandbox.Backend.
	Runtime string `json:"runtime,omitempty"`
}

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopped  = "stopped" // the guest died; resume restarts it, delete removes it
	StateDeleting = "deleting"
)

// Sandbox describes one sandbox.
type Sandbox struct {
	ID           string            `json:"id"`
	Tenant       string            `json:"tenant,omitempty"` // owner (api/tenants.go)
	Template     string            `json:"template"`
	TemplateID   string            `json:"template_id"` // content hash of the template's layers
	State        string            `json:"state"`
	Env          map[string]string `json:"env,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Resources    Resources         `json:"resources"`
	Hostname     string            `json:"hostname"`
	Backend      string            `json:"backend"`
	GuestVersion string            `json:"guest_version,omitempty"`
	Runner       string            `json:"runner,omitempty"` // hash of the runner the guest runs (api/upgrade.go)
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    *time.Time        `json:"expires_at,omitempty"`
	Network      *NetworkSpec      `json:"network,omitempty"`
	// Lifecycle fields (api/lifecycle.go): the preset, the effective idle
	// policy, the last activity and the last transition.
	Name           string      `json:"name,omitempty"`
	Lifecycle      string      `json:"lifecycle,omitempty"`
	Idle           *IdlePolicy `json:"idle,omitempty"`
	LastActivityAt *time.Time  `json:"last_activity_at,omitempty"`
	LastTransition *Transition `json:"last_transition,omitempty"`
	// Limit reports (api/limits.go), filled in by GET /v1/sandboxes/{id}.
	OOMKills int64      `json:"oom_kills,omitempty"`
	Disk     *DiskUsage `json:"disk,omitempty"`
	// CPUBound: the sandbox has a task that stays runnable, and yields the
	// CPU to the sandboxes that do not (api/limits.go).
	CPUBound bool `json:"cpu_bound,omitempty"`
	// IDRange is the host uid and gid range the sandbox's user namespace
	// maps its ids 0..Size-1 onto: its own, shared with no other sandbox.
	// Absent for sandboxes created before per-sandbox ranges existed
	// (they run in the daemon's canonical range).
	IDRange *IDRange `json:"id_range,omitempty"`
}

// IDRange is a range of host ids: HostID..HostID+Size-1, for uids and gids
// alike.
type IDRange struct {
	HostID uint32 `json:"host_id"`
	Size   uint32 `json:"size"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// TTY asks for a pseudo-terminal of the given size.
type TTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
//
// Exactly one of Cmd (argv, run directly) or Command (a string run by
// "/bin/sh -c") must be set.
type ExecRequest struct {
	Cmd            []string          `json:"cmd,omitempty"`
	Command        string            `json:"command,omitempty"`
	Env            map[string]string `json:"env,omitempty"`        // merged over the sandbox's env
	Cwd            string            `json:"cwd,omitempty"`        // absolute path inside the sandbox; default "/root" or "/"
	User           string            `json:"user,omitempty"`       // name or uid[:gid] inside the sandbox; default root
	Stdin          []byte            `json:"stdin,omitempty"`      // written then closed, unless StdinOpen
	StdinOpen      bool              `json:"stdin_open,omitempty"` // keep stdin open for POST .../processes/{pid}/stdin
	TTY            *TTY              `json:"tty,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"` // kill the process after this long; 0 = none
	Background     bool              `json:"background,omitempty"`      // return at once with the pid; re-attach later
	Secrets        []ExecSecret      `json:"secrets,omitempty"`         // stored secrets put in this process's environment only; see api/secrets.go
	Token          bool              `json:"token,omitempty"`           // mint a bridge token for this run in env AGENTBOX_RUN_TOKEN
	// Private runs the process in a Landlock domain of its own: no other
	// process of the sandbox can read its environment or memory, ptrace it
	// or take its descriptors (its own descendants can). The daemon sets it
	// for every exec given Secrets or a Token. See docs/LIMITS.md for what
	// it does not cover.
	Private bool `json:"private,omitempty"`
	// CheckpointBefore takes a checkpoint of the sandbox before the command
	// starts; RollbackOnFailure (which implies it) puts the sandbox's files
	// back to that checkpoint when the command exits non-zero, is killed or
	// times out, before the exit event is sent. The rollback reverts files
	// through the running guest: other processes (a server started
	// earlier) keep running; see internal/snapshot/txn.go for what it
	// covers. Not with background.
	CheckpointBefore  bool `json:"checkpoint_before,omitempty"`
	RollbackOnFailure bool `json:"rollback_on_failure,omitempty"`
	// OutputSchema is a JSON Schema (draft 2020-12 by default, at most 64
	// KiB, no external $ref) the command's stdout must conform to, as one
	// JSON document of at most 4 MiB. Stdout is then held back until the
	// exit and stderr is not delivered at all: a conforming stdout is
	// delivered followed by the exit (whatever its status); otherwise one
	// error event replaces it, with code failed_precondition and reason
	// "output_schema_mismatch" (too_large and "output_too_large" beyond
	// the bound), naming the failing locations and never quoting the
	// output. Not with background or tty. See docs/ARTIFACTS.md.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}

// Exec event types, one JSON object per line in an exec or attach stream
// (Content-Type: application/x-ndjson).
const (
	EventStarted = "started" // Pid set
	EventStdout  = "stdout"  // Data set
	EventStderr  = "stderr"  // Data set (never sent with a TTY: output is merged)
	EventExit    = "exit"    // ExitCode, Signal, TimedOut set; last event
	EventError   = "error"   // Error set; last event
)

// ExecEvent is one line of an exec or attach stream.
type ExecEvent struct {
	Type     string `json:"type"`
	Pid      int    `json:"pid,omitempty"`
	Data     []byte `json:"data,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"` // set on exit; -1 when killed by a signal
	Signal   string `json:"signal,omitempty"`    // e.g. "KILL" when killed by a signal
	TimedOut bool   `json:"timed_out,omitempty"`
	// OOMKilled (exit event): the process was killed by the sandbox's
	// out-of-memory killer (SIGKILL while the sandbox's memory limit was
	// hit; its OOM kill count grew while the stream was open).
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     *Error `json:"error,omitempty"`
	// Checkpoint is the id of the automatic checkpoint taken before the
	// command (exit event of a checkpoint_before exec); RolledBack says the
	// sandbox was restored to it.
	Checkpoint string `json:"checkpoint,omitempty"`
	RolledBack bool   `json:"rolled_back,omitempty"`
}

// Process describes a process started through exec.
type Process struct {
	Pid int      `json:"pid"`
	Cmd []string `json:"cmd"`
	TTY bool     `json:"tty"`
	// Private: started with ExecRequest.Private (every exec given secrets
	// or a run token): its memory may hold them.
	Private   bool       `json:"private,omitempty"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"` // -1 when killed by a signal
	Signal    string     `json:"signal,omitempty"`    // e.g. "KILL" when killed by a signal
	TimedOut  bool       `json:"timed_out,omitempty"` // killed because its timeout expired
	StartedAt time.Time  `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
}

// ProcessList is the body of GET /v1/sandboxes/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"` // "TERM", "KILL", "INT", "HUP", ... or a number
}

// ResizeRequest is the body of POST .../processes/{pid}/resize.
type ResizeRequest = TTY

// File types in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes one filesystem entry inside a sandbox.
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"` // permission bits and setuid/setgid/sticky (07777)
	UID        int       `json:"uid"`
	GID        int       `json:"gid"`
	ModTime    time.Time `json:"mod_time"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// File system event types (FSEvent.Type).
const (
	FSEventCreate = "create" // made, or moved in
	FSEventWrite  = "write"  // content changed
	FSEventRemove = "remove" // deleted
	FSEventRename = "rename" // moved away (its new name, if still watched, is a create)
	FSEventChmod  = "chmod"  // metadata (mode, owner, times) changed
)

// FSEvent is one line of GET /v1/sandboxes/{id}/fs/watch (NDJSON): a
// change of an entry under the watched directory, as the sandbox's
// kernel reported it (inotify).
type FSEvent struct {
	Type string `json:"type"`
	Path string `json:"path"` // absolute path inside the sandbox
	Name string `json:"name"` // Path relative to the watched directory ("." for itself)
}

// FileList is the body of GET /v1/sandboxes/{id}/fs/list.
type FileList struct {
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/fs/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
	Parents bool   `json:"parents,omitempty"`
}

// MoveRequest is the body of POST /v1/sandboxes/{id}/fs/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Template describes a built (or buildable) template.
type Template struct {
	Name      string            `json:"name"`
	Tenant    string            `json:"tenant,omitempty"` // owner; "admin" templates are the shared catalogue
	ID        string            `json:"id,omitempty"`     // content hash; empty when not built
	Built     bool              `json:"built"`
	Builtin   bool              `json:"builtin"`
	SizeBytes int64             `json:"size_bytes,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	CreatedAt *time.Time        `json:"created_at,omitempty"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// TemplateSpec is a declarative template: a base and ordered steps.
type TemplateSpec struct {
	Name  string            `json:"name"`
	Base  string            `json:"base"` // "scratch+busybox", "debootstrap:bookworm", or another template's name
	Steps []TemplateStep    `json:"steps,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// Resources are the defaults of sandboxes of this template (zero
	// fields: the daemon's); not part of the build.
	Resources *Resources `json:"resources,omitempty"`
	// Runtime is the isolation backend (Info.Backends) of sandboxes of
	// this template whose create names none; "": the daemon's default.
	// Not part of the build: build steps run on the daemon's default.
	Runtime string `json:"runtime,omitempty"`
}

// TemplateStep is one build step; exactly one field is set.
type TemplateStep struct {
	Run  string            `json:"run,omitempty"`  // shell command run inside the image being built
	Copy *CopyStep         `json:"copy,omitempty"` // host file or directory copied in
	Env  map[string]string `json:"env,omitempty"`  // environment for later steps and for sandboxes
}

// CopyStep copies Src (on the daemon host) to Dst (absolute, inside).
type CopyStep struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
}

// BuildTemplateRequest is the body of POST /v1/templates/build. Either Name
// of a builtin or registered template, or a full Spec.
type BuildTemplateRequest struct {
	Name  string        `json:"name,omitempty"`
	Spec  *TemplateSpec `json:"spec,omitempty"`
	Force bool          `json:"force,omitempty"` // rebuild even if cached
}

// Build progress event types (application/x-ndjson).
const (
	BuildEventStep  = "step"  // Step, Steps, Message set
	BuildEventLog   = "log"   // Message set: a line of build output
	BuildEventDone  = "done"  // Template set; last event
	BuildEventError = "error" // Error set; last event
)

// BuildEvent is one line of a template build stream.
type BuildEvent struct {
	Type     string    `json:"type"`
	Step     int       `json:"step,omitempty"`
	Steps    int       `json:"steps,omitempty"`
	Message  string    `json:"message,omitempty"`
	Cached   bool      `json:"cached,omitempty"`
	Template *Template `json:"template,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// BackendInfo describes one isolation backend of the daemon: the name a
// create request's runtime field gives, and what it enforces.
type BackendInfo struct {
	Name         string   `json:"name"`
	Default      bool     `json:"default,omitempty"`
	Capabilities []string `json:"capabilities"`
	CgroupMode   string   `json:"cgroup_mode,omitempty"`
	// Details are facts the backend reports beside its capabilities
	// (gvisor: runsc, version, platform).
	Details map[string]string `json:"details,omitempty"`
	// Unavailable, when set, says why this backend, known to the daemon,
	// does not run on its host (gvisor without runsc, and how to install
	// it); a create asking for it is refused (failed_precondition).
	Unavailable string `json:"unavailable,omitempty"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version      string   `json:"version"`
	API          string   `json:"api"`
	Backend      string   `json:"backend"`
	Capabilities []string `json:"capabilities"`
	CgroupMode   string   `json:"cgroup_mode"`
	DataDir      string   `json:"data_dir"`
	Sandboxes    int      `json:"sandboxes"`
	// Backend, Capabilities and CgroupMode describe the default backend;
	// Backends lists every backend the daemon runs, the default first.
	Backends []BackendInfo `json:"backends,omitempty"`
	// StorageDriver is the layer storage driver: "copy" or "reflink".
	StorageDriver string `json:"storage_driver,omitempty"`
	// DiskQuota is how disk_bytes and disk_inodes are enforced:
	// DiskQuotaXFSProject or DiskQuotaLoopExt4; "" when they cannot be.
	DiskQuota string `json:"disk_quota,omitempty"`
	// DefaultDiskBytes and DefaultDiskInodes are the disk limit of a
	// sandbox that asks for none (api/limits.go); 0: the daemon has no
	// default disk limit. MaxDiskBytes and MaxDiskInodes are the most a
	// tenant's sandbox may have (the admin's are not bound); 0: no ceiling.
	DefaultDiskBytes  int64 `json:"default_disk_bytes,omitempty"`
	DefaultDiskInodes int64 `json:"default_disk_inodes,omitempty"`
	MaxDiskBytes      int64 `json:"max_disk_bytes,omitempty"`
	MaxDiskInodes     int64 `json:"max_disk_inodes,omitempty"`
}
