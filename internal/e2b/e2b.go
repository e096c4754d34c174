// Package e2b is agentbox's E2B-compatible front door: the control plane
// of E2B's REST API (create, list, get, kill, timeout, pause, connect,
// snapshots, fork, metrics) and the in-sandbox "envd" API (the Connect
// services process.Process and filesystem.Filesystem, REST /files and
// /health), served on one host:port by `agentbox serve --e2b ADDR`, so
// the unmodified e2b SDKs work with E2B_API_URL and E2B_SANDBOX_URL
// pointing at it. docs/E2B.md has the compatibility table.
//
// It is a front end like internal/mcpserver: every call goes to a
// Sandboxes (the daemon's service) with a context carrying the caller's
// tenant principal, so tenancy, quotas, run records and metering are
// those of the HTTP API; commands run through the one execute path
// (Sandboxes.Exec, the pipeline with trigger "e2b"). The package keeps no
// state of its own beyond process tags and watchers in memory: E2B's
// metadata and template name are labels of the sandbox, snapshots are
// checkpoints, envd access tokens are MACs (tokens.go).
//
// Routing (server.go): a request whose Host is {port}-{id}.{domain}
// (Config.Hosts) or that carries E2b-Sandbox-Id is sandbox traffic for
// that port: envd's port (49983) is served here, any other port in
// Config.Ports by its PortHandler (the daemon registers the code
// interpreter's 49999, proxied to the code server in the sandbox), and
// by host, any other port by Config.Hosts (service URLs); everything else
// is the control plane, authenticated by X-API-KEY.
package e2b

import (
	"context"
	"io"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
)

// Sandboxes is what the E2B front end calls: the daemon core as the HTTP
// edge sees it (the methods of the same names of httpapi.Service,
// CheckpointService and LifecycleService), except that Exec must record
// its runs with trigger api.TriggerE2B, plus SandboxStats
// (sandbox.Handle.Stats, as Stats) and SetTimeout. The contract of httpapi.Service
// applies: ctx carries the caller (tenant principal and run-record
// identity); a sandbox id of another tenant is errdefs.ErrNotFound like
// an unknown one; errors wrap an errdefs category, and only the text of
// client-category errors may be shown to the caller.
type Sandboxes interface {
	CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	GetSandbox(ctx context.Context, id string) (api.Sandbox, error)
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	PauseSandbox(ctx context.Context, id string) (api.Sandbox, error)
	ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error)
	// SetTimeout makes the sandbox's hard lifetime end d from now (time
	// asleep not counted, as for CreateSandboxRequest.TimeoutSeconds).
	SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error)
	SandboxStats(ctx context.Context, id string) (Stats, error)
	// SandboxTransitions is the sandbox's lifecycle log, oldest first.
	SandboxTransitions(ctx context.Context, id string) ([]api.Transition, error)

	Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error)
	Attach(ctx context.Context, id string, pid int, replay bool) (execstream.Stream, error)
	ListProcesses(ctx context.Context, id string) ([]api.Process, error)
	WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error
	Signal(ctx context.Context, id string, pid int, sig string) error
	Resize(ctx context.Context, id string, pid int, tty api.TTY) error

	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error)
	Stat(ctx context.Context, id, path string) (api.FileInfo, error)
	List(ctx context.Context, id, path string) ([]api.FileInfo, error)
	Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error)
	Move(ctx context.Context, id string, req api.MoveRequest) error
	Remove(ctx context.Context, id, path string, recursive bool) error

	CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (api.Checkpoint, error)
	ListCheckpoints(ctx context.Context, id string) ([]api.Checkpoint, error)
	GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, cid string) error
	ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error)
	ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error)
}

// Stats are a running sandbox's cgroup counters (sandbox.Handle.Stats).
type Stats struct {
	CPUTime     time.Duration // CPU time used since it started
	MemoryBytes int64         // memory in use now
}

// Watcher is implemented by Sandboxes that can watch a directory
// (httpapi.WatchService's WatchDir); without it filesystem.Filesystem
// WatchDir answers Unimplemented.
type Watcher interface {
	WatchDir(ctx context.Context, id, path string, recursive bool) (FSEvents, error)
}

// FSEvents is a stream of file system events: Next blocks until an
// event, the end (io.EOF) or an error; Close (from any goroutine) ends
// it.
type FSEvents interface {
	Next() (api.FSEvent, error)
	Close() error
}

// Owners is implemented by Sandboxes that can make files and directories
// owned by a user of the sandbox (sandboxfiles.Files' WriteFileAs and
// MkdirAs): what E2B's files API writes and makes for a user is then that
// user's, as on E2B. Without it they are root's.
type Owners interface {
	WriteFileAs(ctx context.Context, id, path, owner string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error)
	MkdirAs(ctx context.Context, id, owner string, req api.MkdirRequest) (api.FileInfo, error)
}
