// Package runtime defines the isolation backend contract: how a sandbox's
// guest (the in-sandbox agent, PID 1) is started inside an isolated Linux
// computer, re-adopted after a daemon restart, and destroyed without a trace.
//
// The backend knows nothing about templates, exec or files: it receives
// prepared filesystem layers and a runner directory, and hands back a unix
// socket path on which the guest answers. Everything the guest says is
// untrusted; the backend never interprets it.
//
// # Backends chosen by configuration
//
// A daemon runs several backends side by side in a Registry, by name
// (Capabilities.Name); its --runtime setting names the default. A create
// request may name another (api.CreateSandboxRequest.Runtime); the name is
// recorded with the sandbox (api.Sandbox.Backend), and every later
// operation on it, re-adoption by a restarted daemon included, goes to that
// backend. Daemon-wide duties beyond single sandboxes are optional
// interfaces beside Backend: Closer (stop what the backend runs of its
// own), Sweeper (remove what no record claims at start-up), Prespawner
// (start guests ahead of need) and IDRangeClaimer.
//
// # The guest start-up protocol
//
// Every backend starts the same guest, the runner: the agentbox binary in
// Spec.RunnerDir (staged and self-checked by package runner), and owes it
// the following; the guest owes the backend the rest.
//
//  1. The guest sees the sandbox's root filesystem (Spec.Layers under
//     Spec.UpperDir, as overlayfs does) as "/", and the runner directory
//     read-only at /.agentbox, which is never part of the user's layers.
//  2. The backend creates the listening unix socket at Spec.SocketPath
//     (0600, in a root-only host directory never visible inside) and hands
//     it to the guest already listening: the guest never creates or
//     resolves a host path. The guest serves the guest protocol
//     (package guest/proto; guest.Serve) on every connection it accepts.
//  3. The guest reports when setup is complete (or why it failed) on a
//     channel of the backend's; Create returns only then, so the first
//     connection needs no retry. The report is untrusted: it is quoted in
//     an error, never acted on.
//  4. The guest's stdout and stderr go to a file in Spec.StateDir; its
//     environment is the backend's, not the user's (sandbox processes get
//     their own from each exec).
//
// The native backend's form of it is package native/nsinit: the runner is
// executed as "agentbox guest init" through its descriptor (fd 6, closed
// first thing), with the listener on fd 3 (nsinit.ListenerFD); a
// SOCK_SEQPACKET socket on fd 4 (nsinit.ConfigFD) carrying one message, a
// JSON nsinit.Config with two descriptors (SCM_RIGHTS): the root
// filesystem and the runner directory as detached mounts the host built;
// and a pipe on fd 5 (nsinit.SyncFD) on which the guest writes "w" once it
// waits for its config (a prespawned guest is claimed only then), then "ok"
// or a JSON nsinit.SyncMessage. Its version is nsinit.SetupVersion, which
// a runner's self-check reports: a daemon stages (and so starts) only
// runners of its own setup version. Another backend (a VM, gVisor) may
// carry the same three things differently; what the guest serves on the
// listener does not change. A test-only backend without isolation may
// serve the guest in-process instead, saying what of the above it does
// not provide.
//
// Implementations live in subpackages (native, ...); runtimetest holds the
// conformance suite every implementation must pass. docs/CONTRACTS.md,
// "Runtime backends: the contract" and "Adding a backend", says the same
// for readers of the repository.
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
	// CapOwnKernel: sandbox processes make their system calls to a kernel
	// of the backend's own (gVisor's sentry, a user-space kernel), never
	// to the host's: a host kernel bug in the syscall surface is not
	// reachable from inside. CapSeccomp and CapUserNamespaces then say
	// nothing about the sandbox processes themselves.
	CapOwnKernel = "own-kernel"
	// CapMemoryCheckpoint: the backend implements MemoryRestorer and its
	// sandboxes MemoryCheckpointer.
	CapMemoryCheckpoint = "memory-checkpoint"
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
// serialises operations on one id. A sandbox's life on a backend: Create
// (or, in a later daemon, Recover from the persisted State), then any
// number of Sandbox calls, then Destroy; or, when the Sandbox is lost
// (Recover failed, the daemon crashed mid-create), Cleanup from the spec
// alone. The id may be created again once Destroy or Cleanup returned nil
// (a hibernated sandbox's guest is started again under its id).
type Backend interface {
	Capabilities() Capabilities

	// Create starts the sandbox's guest and returns once the guest accepts
	// connections on spec.SocketPath. On error nothing of the sandbox is
	// left behind (processes, cgroups, mounts, socket).
	//
	// An id whose guest runs on the backend (created by this process or
	// an earlier daemon, neither destroyed nor cleaned up) is refused with
	// errdefs.ErrAlreadyExists, and nothing of that sandbox is touched.
	// Callers Destroy or Cleanup an id before they create it again; an id
	// whose guest has exited but that was not destroyed may be refused
	// too (native refuses as long as the sandbox's cgroup exists). A stale
	// socket file left at spec.SocketPath by a sandbox that is gone is
	// replaced.
	//
	// ctx bounds Create (without a deadline the backend applies its own,
	// native: 30 s for the guest's setup); a backend need not interrupt
	// every step for it (native waits for ctx only once the guest is
	// started). When ctx ends first, Create tears everything down on a
	// context of its own (context.WithoutCancel) and returns an error that
	// is ctx.Err() (errors.Is; native's is errdefs.ErrDeadlineExceeded
	// too).
	Create(ctx context.Context, spec Spec) (Sandbox, error)

	// Recover re-adopts a sandbox created by an earlier daemon from the
	// opaque state its Sandbox.State returned. It fails with
	// errdefs.ErrNotFound when the sandbox no longer runs, or when the
	// state is unreadable; the caller then calls Cleanup to reap what is
	// left. The guest it adopts is untouched: its processes never notice.
	//
	// State is persisted across daemon upgrades: a backend must recover
	// from the State of every earlier release (native: JSON {pid,
	// start_time, cgroup}, accepting sandboxes made under the parent
	// cgroup of releases before per-daemon parents), only add fields to
	// it, and never change a field's meaning. A state it cannot read
	// makes the caller reap a live sandbox.
	Recover(ctx context.Context, spec Spec, state []byte) (Sandbox, error)

	// Cleanup removes whatever is left of a sandbox that could not be
	// recovered (processes, cgroups, socket, state dir). Idempotent; nil
	// for an id the backend knows nothing of.
	Cleanup(ctx context.Context, spec Spec) error
}

// Closer is implemented by backends that run something of their own
// beyond their sandboxes (native: prespawned guests, the forker helper,
// the CPU yield policy, the lock on its cgroup parent). Close stops it;
// sandboxes keep running, for the next daemon to re-adopt. Call it once,
// after the last call to the backend.
type Closer interface {
	Close() error
}

// Sweeper is implemented by backends that can find host resources of
// sandboxes no record claims (native: cgroups under its own parent, when
// it owns that parent alone). SweepOrphans removes those of every sandbox
// id keep rejects and returns the ids it removed; errors of single
// sandboxes are joined, the sweep goes on. The daemon calls it once at
// start-up, after every record has been re-adopted or reaped, with keep
// accepting every id it knows.
type Sweeper interface {
	SweepOrphans(ctx context.Context, keep func(id string) bool) ([]string, error)
}

// Prespawner is implemented by backends that start guests ahead of need
// (native: Prespawn). FillPool lets them start: the daemon calls it once
// every host id range a recovered sandbox runs in is marked in use, so a
// prespawned guest never takes one (IDRangeClaimer). Idempotent.
type Prespawner interface {
	FillPool()
}

// Describer is implemented by backends with facts to report beside their
// capabilities (gvisor: runsc's path, gVisor version and platform);
// agentbox info shows them (api.BackendInfo.Details). The map is the
// caller's.
type Describer interface {
	Describe() map[string]string
}

// Sandbox is one running (or exited) sandbox. Methods are safe for
// concurrent use.
type Sandbox interface {
	ID() string
	// SocketPath is the host unix socket on which the guest answers.
	SocketPath() string
	// State returns the opaque record Recover needs; the caller persists
	// it in its store, where daemons of later releases read it back (see
	// Backend.Recover).
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

// CounterReader is implemented by sandboxes whose Stats asks for more
// than the host's cgroup counters: gvisor's asks the sentry for its task
// count (Pids) through a runsc subprocess, tens of milliseconds. Counters
// returns Stats without that (Pids is 0, "not counted"), at the cost of a
// few file reads. The core samples counters around every exec (OOM kills
// to tell an OOM kill from another SIGKILL, CPU time for the run record),
// and uses Counters for that when a sandbox has it. Safe for concurrent
// use; after Destroy it fails like Stats.
type CounterReader interface {
	Counters(ctx context.Context) (Stats, error)
}

// MemoryCheckpointer is implemented by sandboxes whose processes' memory
// and state can be saved (gvisor: runsc checkpoint). Callers type-assert;
// a backend without it has no memory checkpoints (the caller's error is
// errdefs.ErrFailedPrecondition).
type MemoryCheckpointer interface {
	// CheckpointMemory writes the sandbox's memory and process image into
	// dir (an empty directory of the caller's) and leaves the sandbox
	// running. The sandbox's processes are stopped while frozen runs
	// (nil: nothing), which sees the filesystem exactly as the image does
	// (the caller copies the upper dir there), and while the image is
	// written. The guest's connections are closed meanwhile: a client
	// dials again afterwards (the socket path is the same). On error dir
	// may hold a partial image the caller removes; the sandbox runs on
	// when it can (it is left stopped only when its guest does not come
	// back, which Status then reports).
	CheckpointMemory(ctx context.Context, dir string, frozen func() error) error
}

// MemoryRestorer is implemented by backends whose sandboxes are
// MemoryCheckpointers: it starts a sandbox from a memory image instead of
// booting its guest.
type MemoryRestorer interface {
	// RestoreMemory is Create (same contract, same spec) except that the
	// sandbox's processes continue from the image in dir (written by
	// CheckpointMemory of any sandbox of this backend; one image may be
	// restored any number of times, concurrently) instead of a new guest
	// being started. spec's layers must hold the files the image was
	// taken over (the checkpoint's). Kernel state goes with the image,
	// but for the identity: the sandbox's hostname is spec.Hostname (not
	// the source's) when RestoreMemory returns, so that each sandbox
	// restored from one image has its own (its files of identity are the
	// caller's, in spec's layers: internal/identity).
	RestoreMemory(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}
