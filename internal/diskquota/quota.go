// Package diskquota caps the size and inode count of a sandbox's writable
// layer: its sandbox dir (upper, work, state and the trash of restores)
// may hold at most Limits, and a sandbox that fills it gets ENOSPC while
// the host and other sandboxes keep their space. It is the one package
// that knows filesystems; the sandbox Manager uses it through an
// interface of its own.
//
// Two methods, chosen by Detect:
//
//   - Project ("xfs-project"): when the sandboxes dir lives on XFS mounted
//     with project quotas enforced (prjquota), each capped sandbox dir gets
//     a project id of its own, set with inheritance on the directory, and
//     block and inode hard limits on that project. No device, no image,
//     no mount: the dir stays a plain directory. Ids come from a fixed
//     range and are persisted, so a restarted daemon re-adopts and frees
//     them.
//   - Loop ("loop-ext4"): anywhere else, a sparse image formatted ext4 (no
//     reserved blocks, a fixed inode count) on an auto-clearing loop device
//     is mounted at the sandbox dir, which is then a filesystem of its own
//     (see loop_linux.go).
package diskquota

import "context"

// Names of the methods (Quota.Method), as api.Info reports them.
const (
	MethodProject = "xfs-project"
	MethodLoop    = "loop-ext4"
)

// Quota caps what sandbox dirs may hold. A sandbox is named by its id and
// its dir: the caller owns the dir (creates it, empty, before Apply; it
// may remove it after Remove).
//
// Implementations are safe for concurrent use by different sandboxes;
// calls for one sandbox must not overlap. Apply either succeeds or leaves
// nothing of the quota behind; Remove is idempotent and may be retried
// after an error.
type Quota interface {
	// Method names the method: MethodProject or MethodLoop.
	Method() string
	// Apply caps dir, the fresh empty dir of sandbox id, at lim. What is
	// created in dir afterwards counts against lim.
	Apply(ctx context.Context, dir, id string, lim Limits) error
	// Usage reports what sandbox id's dir holds against its limits. It
	// fails with errdefs.ErrNotFound when id has no quota in force (none
	// applied, or a Mounter's filesystem that is not mounted).
	Usage(dir, id string) (Usage, error)
	// Remove deletes what sandbox id's dir holds under its quota and frees
	// the quota; the dir itself may be left, empty. Nothing happens when id
	// has no quota.
	Remove(ctx context.Context, dir, id string) error
	// IDs lists the sandboxes that have a quota, also those of a previous
	// daemon: the caller removes the ones it has no record of.
	IDs() ([]string, error)
}

// Mounter is a Quota whose sandbox dir is a filesystem of its own: it must
// be mounted while a guest may use the dir and may be unmounted while none
// does (a hibernated sandbox keeps nothing resident).
type Mounter interface {
	// Mount mounts sandbox id's filesystem at dir when it has one and it
	// is not mounted.
	Mount(dir, id string) error
	// Unmount unmounts dir when it is mounted.
	Unmount(dir string) error
}

// Limits bound what one sandbox dir may hold.
type Limits struct {
	Bytes  int64 // at least MinBytes
	Inodes int64 // 0: loop: ext4's default for the size; project: no inode limit
}

// MinBytes is the smallest quota: a loop filesystem's ext4 metadata and
// journal need room.
const MinBytes = 16 << 20

// Usage is what a sandbox dir holds against its limits.
type Usage struct {
	Bytes, BytesTotal   int64
	Inodes, InodesTotal int64 // InodesTotal 0: no inode limit
}

// Error is a failed system call or tool run of a quota.
type Error struct {
	Op   string // "mkfs", "losetup", "mount", "umount2", "quotactl", ...
	Path string
	Err  error
}

func (e *Error) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }
