// Package native is the isolation backend built directly on Linux
// primitives: user, mount, pid, uts, ipc, net and cgroup namespaces, cgroups
// (v1 or v2, through containerd/cgroups), overlayfs, a capability bounding
// set, no_new_privs and a seccomp filter. It uses no OCI runtime.
//
// The host side (this package) creates the cgroup and the guest's listening
// socket, starts the runner copy of the agentbox binary as "agentbox guest
// init" in fresh namespaces (through a forker helper, package forker, when
// Config.Forker names one), builds the sandbox's root filesystem and runner
// bind as detached mounts (mounts.go: idmapped onto the sandbox's own host
// id range when it differs from the layers'), hands them to the guest and
// waits for it to report that setup is done. Everything inside the
// namespaces is done by package nsinit, running as the guest's PID 1; the
// guest never resolves a host path, and no mount is ever attached to the
// host's mount namespace, so nothing of a sandbox's filesystem outlives its
// processes.
package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Name is the backend's name in Capabilities.
const Name = "native"

// Config configures the backend.
type Config struct {
	// CgroupParent is the cgroup (relative to every hierarchy root) under
	// which each sandbox gets <CgroupParent>/<id>, and each prespawned
	// guest a cgroup of its own. Default LegacyCgroupParent. Two daemons
	// must not share one (the daemon derives it from its data dir).
	CgroupParent string
	// Logger receives lifecycle events; nil discards them.
	Logger *slog.Logger
	// Prespawn, when set, keeps guests started ahead of need; see Prespawn.
	// Call Close to stop them.
	Prespawn *Prespawn
	// OwnParent declares CgroupParent this backend's alone: New takes a
	// host-wide lock on it (failing with errdefs.ErrUnavailable while
	// another process holds it), removes the cgroups an earlier owner's
	// prespawned guests left under it, SweepOrphans may remove any cgroup
	// under it that no record claims, and Close removes the parent once
	// it is empty. Leave it false on a parent shared by several backends:
	// then nothing under it but this backend's own cgroups is touched.
	OwnParent bool
	// CPUYield turns on the CPU yield policy (see cpuyield.go): sandboxes
	// found CPU-bound are made SCHED_IDLE, and while any is, the parent
	// yields to the host. Call Close to stop it.
	CPUYield bool
	// Forker is a binary that serves as the guests' forker (package
	// forker) when run with ForkerArgs: a runner binary. Guests are then
	// started from that small helper rather than forked from this process
	// (see package forker for why). Empty: this process forks them. Call
	// Close to stop the helper.
	Forker string
}

// Backend is the native runtime.Backend. It holds no per-sandbox state
// beyond the CPU yield policy's watch list of the sandboxes it created or
// recovered, so several instances (e.g. before and after a daemon restart)
// can manage the same sandboxes. Safe for concurrent use on distinct
// sandbox ids.
type Backend struct {
	cgroupParent string
	// legacy holds the ids of sandboxes Recover found under
	// LegacyCgroupParent rather than cgroupParent, for Cleanup.
	legacy     sync.Map
	mode       string // cgroupMode(): "v1", "hybrid" or "v2"
	log        *slog.Logger
	pool       *zygotePool  // nil without Prespawn
	parentLock *os.File     // held from New to Close when OwnParent
	yield      *yielder     // nil unless Config.CPUYield and the kernel has cpu.idle
	forker     *guestForker // nil without Config.Forker
	idmaps     *idmapCache  // user namespaces of idmapped mounts (mounts.go)
}

var (
	_ runtime.Backend     = (*Backend)(nil)
	_ runtime.Sandbox     = (*sandbox)(nil)
	_ runtime.Pauser      = (*sandbox)(nil)
	_ runtime.StatsReader = (*sandbox)(nil)

	_ runtime.IDRangeClaimer = (*Backend)(nil)
	_ runtime.Closer         = (*Backend)(nil)
	_ runtime.Sweeper        = (*Backend)(nil)
	_ runtime.Prespawner     = (*Backend)(nil)
)

var (
	idPattern     = lazyregexp.New(`^[a-z0-9-]{1,64}$`)
	parentPattern = lazyregexp.New(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)
)

// LegacyCgroupParent is the parent all daemons shared before each had its
// own: a backend recovers and cleans up the sandboxes an earlier daemon
// made there, and makes, sweeps or removes nothing else there.
const LegacyCgroupParent = "agentbox"

// New returns a backend. It fails with errdefs.ErrFailedPrecondition when the
// host has no usable cgroup hierarchy.
func New(cfg Config) (*Backend, error) {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = LegacyCgroupParent
	}
	if !parentPattern.MatchString(cfg.CgroupParent) || cfg.CgroupParent != path.Clean(cfg.CgroupParent) ||
		strings.HasPrefix(cfg.CgroupParent, "..") || strings.Contains(cfg.CgroupParent, "/..") {
		return nil, fmt.Errorf("cgroup parent %q: %w", cfg.CgroupParent, errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mode := cgroupMode()
	if mode == "" {
		return nil, fmt.Errorf("native backend: no cgroup hierarchy: %w", errdefs.ErrFailedPrecondition)
	}
	b := &Backend{cgroupParent: cfg.CgroupParent, mode: mode, log: cfg.Logger.With("backend", Name)}
	b.forker = newGuestForker(cfg.Forker, b.log)
	b.idmaps = &idmapCache{forker: b.forker}
	if cfg.OwnParent {
		var err error
		if b.parentLock, err = lockParent(cfg.CgroupParent); err != nil {
			return nil, err
		}
	}
	if cfg.CPUYield {
		dir, err := cpuParentDir(mode, cfg.CgroupParent)
		if err != nil {
			return nil, err
		}
		ctr, err := parentCounters(mode, cfg.CgroupParent)
		if err != nil {
			return nil, err
		}
		if dir != "" {
			b.yield = newYielder(dir, ctr, b.log)
		}
	}
	if cfg.Prespawn != nil {
		if b.parentLock != nil {
			// Only an owned parent holds no other daemon's zygotes.
			b.removeZygoteCgroups(context.Background())
		}
		pool, err := newZygotePool(*cfg.Prespawn, mode, cfg.CgroupParent, b.forker, b.idmaps, b.log)
		if err != nil {
			b.yield.close()
			return nil, err
		}
		b.pool = pool
	}
	return b, nil
}

// Close implements runtime.Closer: it stops the prespawned guests (waiting for those being started),
// the CPU yield policy and the guests' forker, removes an owned parent
// cgroup that no sandbox uses any more and releases its lock. Sandboxes
// are not affected. Call it once; the backend is not used afterwards.
func (b *Backend) Close() error {
	b.yield.close()
	err := b.pool.close()
	b.forker.close()
	if b.parentLock != nil {
		// Fails (and is meant to) while any sandbox cgroup remains.
		for _, root := range b.hierarchyRoots() {
			_ = unix.Rmdir(filepath.Join(root, b.cgroupParent))
		}
		b.parentLock.Close() // the parent is the next owner's
		b.parentLock = nil
	}
	b.idmaps.close()
	return err
}

// FillPool implements runtime.Prespawner: it starts keeping
// Prespawn.Size zygotes ready. With Prespawn.IDs
// the pool waits for it: call it once every range a recovered sandbox
// runs in is marked in use in the allocator. Idempotent; a no-op without
// a pool.
func (b *Backend) FillPool() {
	if b.pool != nil {
		go b.pool.fill()
	}
}

// ClaimIDRange implements runtime.IDRangeClaimer: with Prespawn.IDs, a
// waiting zygote is reserved for the caller's next Create with the
// returned range.
func (b *Backend) ClaimIDRange() (runtime.IDMap, bool) { return b.pool.claim() }

// Capabilities reports what the backend enforces.
func (b *Backend) Capabilities() runtime.Capabilities {
	features := []string{
		runtime.CapUserNamespaces, runtime.CapCgroups, runtime.CapSeccomp,
		runtime.CapNetworkNone, runtime.CapPause, runtime.CapStats,
		runtime.CapIsolation,
	}
	if b.yield != nil {
		features = append(features, runtime.CapCPUYield)
	}
	return runtime.Capabilities{Name: Name, Features: features, CgroupMode: b.mode}
}

// parentCounters reads the CPU time of the sandboxes' parent cgroup.
func parentCounters(mode, parent string) (*counters, error) {
	if mode == "v2" {
		return v2Counters(filepath.Join(cgroupRoot, parent)), nil
	}
	dir, err := v1Dir(cgroup1.Cpuacct, "/"+parent)
	return v1Counters(dir, "", ""), err
}

// cpuParentDir is the host directory of the sandboxes' parent in the cpu
// hierarchy, or "" when no cpu controller is mounted.
func cpuParentDir(mode, parent string) (string, error) {
	if mode == "v2" {
		return filepath.Join(cgroupRoot, parent), nil
	}
	return v1Dir(cgroup1.Cpu, "/"+parent)
}

// cgroupPath is the sandbox's cgroup relative to each hierarchy root.
func (b *Backend) cgroupPath(id string) string {
	return "/" + b.cgroupParent + "/" + id
}

// legacyCgroupPath is where a daemon of a version before per-daemon
// parents put the sandbox.
func legacyCgroupPath(id string) string {
	return "/" + LegacyCgroupParent + "/" + id
}

func validateSpec(spec runtime.Spec) error {
	if !idPattern.MatchString(spec.ID) {
		return fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if len(spec.Layers) == 0 {
		return fmt.Errorf("sandbox %s: no layers: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	paths := append([]string{spec.UpperDir, spec.WorkDir, spec.RunnerDir, spec.SocketPath, spec.StateDir}, spec.Layers...)
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("sandbox %s: path %q is not absolute: %w", spec.ID, p, errdefs.ErrInvalidArgument)
		}
	}
	if spec.UIDMap.Size == 0 || spec.GIDMap.Size == 0 {
		return fmt.Errorf("sandbox %s: empty uid/gid map: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if spec.UIDMap.HostID == 0 || spec.GIDMap.HostID == 0 {
		return fmt.Errorf("sandbox %s: sandbox root must not be host root: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Cleanup removes whatever is left of a sandbox from its spec alone: every
// process in its cgroup, the cgroup, the socket and the state dir.
// Idempotent.
func (b *Backend) Cleanup(ctx context.Context, spec runtime.Spec) error {
	if !idPattern.MatchString(spec.ID) {
		return fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	parents := []string{b.cgroupParent}
	if _, ok := b.legacy.Load(spec.ID); ok {
		parents = append(parents, LegacyCgroupParent)
	}
	var errs []error
	for _, parent := range parents {
		if err := b.removeSandboxCgroup(ctx, parent, spec.ID); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeFiles(spec))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up sandbox %s: %w", spec.ID, err)
	}
	b.log.InfoContext(ctx, "sandbox cleaned up", "sandbox", spec.ID)
	return nil
}

// removeSandboxCgroup kills every process of the cgroup <parent>/<id> and
// removes it.
func (b *Backend) removeSandboxCgroup(ctx context.Context, parent, id string) error {
	cg, err := loadCgroup(b.mode, "/"+parent+"/"+id)
	if err != nil {
		// Not found, or left in some hierarchies only by a crash
		// mid-delete: remove what is there directory by directory.
		return removeCgroupDirs(ctx, b.hierarchyRoots(), parent, id)
	}
	if err := cg.killAll(ctx); err != nil {
		return err
	}
	return cg.delete()
}

// removeFiles removes the socket and the state dir of spec.
func removeFiles(spec runtime.Spec) error {
	var errs []error
	if spec.SocketPath != "" {
		if err := os.Remove(spec.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := removeKeptLog(spec); err != nil {
		errs = append(errs, err)
	}
	if spec.StateDir != "" {
		if err := os.RemoveAll(spec.StateDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
