// Package runtime defines the isolation backend contract: how a sandbox's
// guest (the in-sandbox agent, PID 1) is started inside an isolated Linux
// computer, re-adopted after a daemon restart, and destroyed without a trace.
//
// The backend knows nothing about templates, exec or files: it receives
// prepared filesystem layers and a runner directory, and hands back a unix
// socket path on which the guest answers. Everything the guest says is
// untrusted; the backend never interprets it.
//
// Implementations live in subpackages (native, ...); runtimetest holds the
// conformance suite every implementation must pass.
package runtime

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/idrange"
)

// Capability names reported by backends.
const (
	CapUserNamespaces = "userns"    // sandbox root is an unprivileged host uid
	CapCgroups        = "cgroups"   // cpu, memory and pids limits enforced
	CapSeccomp        = "seccomp"   // syscall filter on every sandbox process
	CapNetworkNone    = "net-none"  // private network namespace, loopback only
	CapPause          = "pause"     // implements Pauser
	CapStats          = "stats"     // implements StatsReader
	CapCPUYield       = "cpu-yield" // CPU-bound sandboxes yield to interactive ones (cgroup cpu.idle)
	// CapIsolation: each sandbox's processes see its own root filesystem
	// (Layers and UpperDir), hostname and process tree, and nothing of
	// the host's. A backend without it (the in-process test backend)
	// runs them on the host as the daemon's own children.
	CapIsolation = "isolation"
)

// Capabilities describe what a backend enforces. A backend lists only what it
// really does; optional operations are separate interfaces (Pauser, ...).
type Capabilities struct {
	Name       string   // "native", "gvisor", ...
	Features   []string // Cap* constants
	CgroupMode string   // "v1", "v2", "hybrid" or "" when cgroups are not used
}

// Has reports whether the capability is listed.
func (c Capabilities) Has(feature string) bool {
	for _, f := range c.Features {
		if f == feature {
			return true
		}
	}
	return false
}

// IDMap maps a contiguous range of ids inside the sandbox, starting at 0, to
// host ids starting at HostID. It is defined in the leaf package idrange so
// that packages owning files by id range need not import this contract.
type IDMap = idrange.IDMap

// Resources are cgroup limits; zero fields mean "no limit".
type Resources struct {
	CPUs        float64 // cores (cfs quota / period)
	MemoryBytes int64   // hard limit, swap disabled
	PidsMax     int64
	// OpenFiles is RLIMIT_NOFILE (soft and hard) of every process in the
	// sandbox, capped at the daemon's own hard limit; 0 leaves it as is.
	OpenFiles int64
}

// Spec is everything a backend needs to start a sandbox.
type Spec struct {
	// ID is unique among live sandboxes: [a-z0-9-]{1,64}.
	ID string
	// Layers are read-only overlay lower directories, top-most first. Their
	// files must be owned by ids inside LayerIDs.
	Layers []string
	// UpperDir and WorkDir are the sandbox's writable overlay directories,
	// siblings in one directory, created empty (or kept from an earlier
	// run) by the caller, owned by LayerIDs.HostID.
	UpperDir string
	WorkDir  string
	// LayerIDs is the host id range Layers, UpperDir and WorkDir are owned
	// by on disk (zero: UIDMap). When it differs from UIDMap/GIDMap the
	// backend shows them to the sandbox through idmapped mounts: on-disk
	// id LayerIDs.HostID+n is UIDMap.HostID+n to the sandbox, and what the
	// sandbox writes is stored back in LayerIDs. Sizes must be equal.
	LayerIDs IDMap
	// RunnerDir is a host directory holding the guest binary under the name
	// "agentbox". It is mounted read-only at /.agentbox inside the sandbox
	// and is never part of the user's layers.
	RunnerDir string
	// SocketPath is where the backend creates the host-side unix socket on
	// which the guest accepts connections. Its directory is owned by host
	// root and is never visible inside the sandbox.
	SocketPath string
	// StateDir is a host directory private to the backend for this sandbox
	// (state files, logs). Created by the caller, removed by Destroy.
	StateDir string
	Hostname string
	// UIDMap and GIDMap are the sandbox's own host id range (its user
	// namespace maps 0..Size-1 onto it).
	UIDMap    IDMap
	GIDMap    IDMap
	Resources Resources
}

// IDRangeClaimer is implemented by backends that start guests ahead of
// need, each in a host id range of its own (native's Prespawn pool).
// ClaimIDRange reserves such a guest and hands its range to the caller, who
// owns it from then on (and frees it to its allocator once the sandbox is
// gone); a Create whose UIDMap and GIDMap are that range uses the reserved
// guest. false: no guest is ready; the caller allocates a range itself.
type IDRangeClaimer interface {
	ClaimIDRange() (IDMap, bool)
}

// Status is a sandbox's observed state.
type Status string

const (
	StatusRunning Status = "running"
	StatusStopped Status = "stopped" // the guest has exited; Destroy still required
)

// Backend starts and re-adopts sandboxes.
//
// Methods are safe for concurrent use on distinct sandbox ids; the caller
// serialises operations on one id.
type Backend interface {
	Capabilities() Capabilities

	// Create starts the sandbox's guest and returns once the guest accepts
	// connections on spec.SocketPath. On error nothing of the sandbox is
	// left behind (processes, cgroups, mounts, socket).
	Create(ctx context.Context, spec Spec) (Sandbox, error)

	// Recover re-adopts a sandbox created by an earlier daemon from the
	// opaque state its Sandbox.State returned. It fails with
	// errdefs.ErrNotFound when the sandbox no longer runs; the caller then
	// calls Cleanup to reap what is left.
	Recover(ctx context.Context, spec Spec, state []byte) (Sandbox, error)

	// Cleanup removes whatever is left of a sandbox that could not be
	// recovered (processes, cgroups, socket, state dir). Idempotent.
	Cleanup(ctx context.Context, spec Spec) error
}

// Sandbox is one running (or exited) sandbox. Methods are safe for
// concurrent use.
type Sandbox interface {
	ID() string
	// SocketPath is the host unix socket on which the guest answers.
	SocketPath() string
	// State returns the opaque record Recover needs; the caller persists it.
	State() []byte
	// Status reports whether the guest still runs.
	Status(ctx context.Context) (Status, error)
	// Wait returns a channel closed when the guest has exited.
	Wait() <-chan struct{}
	// Destroy kills every process of the sandbox (escaped session leaders
	// and double forks included), and removes its cgroups, socket and state
	// dir. After it returns nil no process, mount, cgroup or namespace of
	// the sandbox remains. Idempotent. Callers pass a context that outlives
	// request cancellation (context.WithoutCancel).
	Destroy(ctx context.Context) error
}

// Pauser is implemented by sandboxes whose processes can be frozen.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Stats are resource usage counters of a sandbox.
type Stats struct {
	CPUTime     time.Duration
	MemoryBytes int64
	Pids        int64
	OOMKills    int64
	// CPUBound is set while the backend has the sandbox yield the CPU as
	// CPU-bound (CapCPUYield).
	CPUBound bool
}

// StatsReader is implemented by sandboxes that expose cgroup counters.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}
