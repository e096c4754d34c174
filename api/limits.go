package api

// Resource limits beyond cpu, memory and pids (fields of Resources):
//
//   - disk_bytes, disk_inodes: the writable layer may hold that many bytes
//     (and inodes); writes beyond it fail with ENOSPC inside the sandbox,
//     while the host and other sandboxes keep their space. 0: unlimited
//     (the host's disk). Info.DiskQuota says how: DiskQuotaXFSProject (an
//     XFS project quota on the data dir's filesystem; disk_inodes 0 is no
//     inode limit) or DiskQuotaLoopExt4 (a filesystem of its own of that
//     size; disk_inodes 0 is ext4's default for the size).
//   - open_files: RLIMIT_NOFILE (soft and hard) of every process in the
//     sandbox. It can only be lowered below the daemon's own hard limit.
//
// A sandbox that asks for none gets its template's defaults
// (TemplateSpec.Resources), then the daemon's.
//
// Memory limits kill the largest process when exceeded (no swap): each OOM
// kill is counted in Sandbox.OOMKills and reported once as a sandbox event
// of type SandboxEventOOM (GET /v1/sandboxes/{id}/events).

// CPU: under contention a sandbox with a task that stays runnable (a build,
// a busy loop) yields the CPU to the sandboxes that do not, and while any
// does, sandboxes yield to the host's processes: Sandbox.CPUBound is set
// meanwhile (backends with the cpu-yield capability; daemon config
// cpu_yield, on by default).

// SandboxEventOOM is the type of the event the daemon records when the
// sandbox's OOM-kill counter grew; Value is the new count.
const SandboxEventOOM = "oom"

// Ways disk quotas are enforced (Info.DiskQuota).
const (
	DiskQuotaXFSProject = "xfs-project"
	DiskQuotaLoopExt4   = "loop-ext4"
)

// DiskUsage is the state of a sandbox's disk quota (GET
// /v1/sandboxes/{id}; with DiskQuotaLoopExt4 only while its filesystem is
// mounted, not while it hibernates). TotalInodes is 0 when inodes are not
// limited.
type DiskUsage struct {
	UsedBytes   int64 `json:"used_bytes"`
	TotalBytes  int64 `json:"total_bytes"`
	UsedInodes  int64 `json:"used_inodes"`
	TotalInodes int64 `json:"total_inodes"`
}

// Warm pools: a pool keeps Size sandboxes of a template created on one
// backend (Runtime) and paused; a create of that template that runs on
// that backend, with default resources, claims one (its id, hostname,
// /etc/machine-id and random seed were its own from when it was pooled)
// and the pool refills in the background. A template may have a pool per
// backend. Pooled sandboxes are not listed until claimed.

// PoolRequest is the body of PUT /v1/templates/{name}/pool.
type PoolRequest struct {
	Size int `json:"size"` // 0 removes the pool
	// Runtime is the backend of the pool's sandboxes (Sandbox.Backend);
	// "": the one a create of the template naming none runs on (the
	// template's runtime, else the daemon's default).
	Runtime string `json:"runtime,omitempty"`
}

// Pool is the state of one warm pool: a template's on one backend.
type Pool struct {
	Template string `json:"template"`
	Runtime  string `json:"runtime"` // the backend its sandboxes run on
	Size     int    `json:"size"`    // target
	Ready    int    `json:"ready"`   // paused, claimable now
	Filling  int    `json:"filling"` // being created
	Claims   int64  `json:"claims"`  // creates served from the pool since start
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// CausePool is the cause of a pooled sandbox's transitions before it is
// claimed (a claimed sandbox's log starts over with its create).
const CausePool = "pool"
