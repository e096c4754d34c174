// Package gvisor is the isolation backend that runs each sandbox under
// gVisor's runsc: the sandbox's processes make their system calls to the
// sentry, a kernel written in Go that runs as an unprivileged process on
// the host, so a bug in the host kernel's syscall surface is not reachable
// from inside (runtime.CapOwnKernel).
//
// Each sandbox is one runsc container (id: the sandbox id) in the backend's
// runsc root. Its bundle (bundle.go) is built on the host: the root
// filesystem is the sandbox's overlay (Spec.Layers under Spec.UpperDir,
// mounted by the host, served to the sentry by runsc's gofer with no overlay
// of runsc's own, so writes land in the upper dir as under native), shown
// through the OCI user namespace mapping so that files owned by
// Spec.LayerIDs on disk are root's inside; the runner dir read-only at
// /.agentbox; no network but the sentry's loopback (--network=none, no
// route to the host; egress goes through the guest's tunnel, as under
// native); CPU and memory limits from linux.resources, applied by runsc
// to the sandbox's host cgroup (v1, v2, or a hybrid host's v1
// hierarchies), and the pids limit as the sentry's RLIMIT_NPROC with a
// host backstop (bundle.go).
//
// The guest is the same runner as native's, started as "agentbox guest
// init-gvisor" (package gvinit) as PID 1; it serves the same guest
// protocol on a unix socket that reaches the host through runsc's
// --host-uds=create: see gvinit for why the guest binds it, and Create for
// how the backend moves it to Spec.SocketPath and closes its directory
// before any user code runs.
//
// Lifecycle: Pause and Resume are runsc pause/resume (the sentry stops its
// tasks); Stats reads the sandbox's host cgroup, and its pids from the
// sentry; SweepOrphans removes what no record claims; Destroy and Cleanup are
// runsc delete --force plus the bundle's mounts, the socket and the state
// dir, and need nothing but the id; Recover checks the sandbox process
// (pid and start time) and runsc's state. The State keeps the runsc root
// and container id, from which a later memory checkpoint (runsc checkpoint
// and restore) can be driven.
package gvisor

import (
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Name is the backend's name in Capabilities.
const Name = "gvisor"

// DefaultCgroupParent is the cgroup under which each sandbox gets
// <parent>/<id> when Config.CgroupParent is empty.
const DefaultCgroupParent = "agentbox-gvisor"

// Config configures the backend.
type Config struct {
	// Runsc is the runsc binary; "" looks for it (FindRunsc).
	Runsc string
	// Root is the backend's directory: runsc's state (Root/runsc) and the
	// sandboxes' bundles (Root/b/<id>). It must stay the same across
	// daemon restarts (Recover and Cleanup find sandboxes through it), and
	// be on the filesystem of the sandboxes' socket paths (the guest's
	// socket is renamed there). Required.
	Root string
	// Platform is runsc's platform: "systrap", "ptrace" or "kvm"; "" is
	// kvm where /dev/kvm opens, else systrap.
	Platform string
	// CgroupParent is the cgroup (relative to the hierarchy roots) under
	// which each sandbox gets <CgroupParent>/<id>; default
	// DefaultCgroupParent. Two daemons must not share one.
	CgroupParent string
	// Logger receives lifecycle events; nil discards them.
	Logger *slog.Logger
}

// Backend is the gVisor runtime.Backend. It keeps no per-sandbox state:
// every sandbox is found from its id in the runsc root, so several
// instances on one Root (before and after a daemon restart) manage the
// same sandboxes. Safe for concurrent use on distinct sandbox ids.
type Backend struct {
	runscPath    string
	version      string // gVisor module version of runscPath
	root         string
	platform     string
	cgroupParent string
	mode         string // "v1", "hybrid" or "v2"
	log          *slog.Logger
}

var (
	_ runtime.Backend       = (*Backend)(nil)
	_ runtime.Sandbox       = (*sandbox)(nil)
	_ runtime.Pauser        = (*sandbox)(nil)
	_ runtime.StatsReader   = (*sandbox)(nil)
	_ runtime.CounterReader = (*sandbox)(nil)
	_ runtime.Describer     = (*Backend)(nil)
	_ runtime.Closer        = (*Backend)(nil)
)

var (
	idPattern     = lazyregexp.New(`^[a-z0-9-]{1,64}$`)
	parentPattern = lazyregexp.New(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)
)

// errInvalid is errdefs.ErrInvalidArgument, for the bundle's own checks.
var errInvalid = errdefs.ErrInvalidArgument

// New returns a backend. It fails with errdefs.ErrFailedPrecondition when
// runsc is not installed (the message says how to install it) or the host
// has no cgroup hierarchy, and errdefs.ErrInvalidArgument for a bad
// setting.
func New(cfg Config) (*Backend, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if !parentPattern.MatchString(cfg.CgroupParent) || cfg.CgroupParent != path.Clean(cfg.CgroupParent) ||
		strings.HasPrefix(cfg.CgroupParent, "..") || strings.Contains(cfg.CgroupParent, "/..") {
		return nil, fmt.Errorf("gvisor cgroup parent %q: %w", cfg.CgroupParent, errdefs.ErrInvalidArgument)
	}
	if cfg.Root == "" || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("gvisor root %q must be an absolute path: %w", cfg.Root, errdefs.ErrInvalidArgument)
	}
	platform, err := choosePlatform(cfg.Platform)
	if err != nil {
		return nil, err
	}
	runsc, err := FindRunsc(cfg.Runsc)
	if err != nil {
		return nil, err
	}
	var mode string
	switch cgroups.Mode() {
	case cgroups.Legacy:
		mode = "v1"
	case cgroups.Hybrid:
		mode = "hybrid"
	case cgroups.Unified:
		mode = "v2"
	default:
		return nil, fmt.Errorf("gvisor backend: no cgroup hierarchy: %w", errdefs.ErrFailedPrecondition)
	}
	// The gofer runs as the sandbox's mapped root and opens its mount
	// sources by path: every directory down to a bundle must let others
	// search it (Root and Root/b are made 0711).
	if err := checkSearchable(filepath.Dir(cfg.Root)); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.Root, filepath.Join(cfg.Root, "b")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor root: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor root: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.Root, "runsc"), 0o700); err != nil {
		return nil, fmt.Errorf("gvisor root: %w", err)
	}
	b := &Backend{
		runscPath: runsc, version: runscVersion(runsc), root: cfg.Root, platform: platform,
		cgroupParent: cfg.CgroupParent, mode: mode, log: cfg.Logger.With("backend", Name),
	}
	b.log.Info("gvisor backend", "runsc", runsc, "version", b.version, "platform", platform, "cgroups", mode)
	return b, nil
}

// Capabilities reports what the backend enforces. There is no seccomp
// filter of ours and no user namespace of the host's between a sandbox
// process and the host kernel: a sandbox process never makes a host
// system call at all (CapOwnKernel); the sentry itself runs under runsc's
// own seccomp filter, as an unprivileged host user.
func (b *Backend) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{
		Name: Name,
		Features: []string{
			runtime.CapOwnKernel, runtime.CapIsolation, runtime.CapNetworkNone,
			runtime.CapCgroups, runtime.CapPause, runtime.CapStats, runtime.CapMemoryCheckpoint,
		},
		CgroupMode: b.mode,
	}
}

// Describe implements runtime.Describer: runsc's path, gVisor version and
// platform.
func (b *Backend) Describe() map[string]string {
	return map[string]string{"runsc": b.runscPath, "version": b.version, "platform": b.platform}
}

// Close implements runtime.Closer: it removes what the backend keeps
// beside its sandboxes: the bind mount of runsc's empty network namespace
// for gofers in its root (runsc makes it again when it next starts a
// gofer; running gofers have joined it already), and the cgroup parent
// once no sandbox is left under it. Sandboxes keep running.
func (b *Backend) Close() error {
	p := filepath.Join(b.root, "runsc", "null-netns")
	for range 64 { // concurrent runsc runs may have stacked several
		if unix.Unmount(p, unix.MNT_DETACH) != nil {
			break
		}
	}
	dirs := []string{filepath.Join(cgroupRoot, b.cgroupParent)}
	if b.mode != "v2" {
		dirs = nil
		for _, d := range b.cgroupDirs("") {
			dirs = append(dirs, filepath.Clean(d))
		}
	}
	for _, d := range dirs {
		_ = unix.Rmdir(d) // fails, as meant, while a sandbox is left
	}
	return nil
}

// bundleDir is the bundle of sandbox id.
func (b *Backend) bundleDir(id string) string { return filepath.Join(b.root, "b", id) }

// cgroupPath is the sandbox's cgroup relative to each hierarchy root.
func (b *Backend) cgroupPath(id string) string { return "/" + b.cgroupParent + "/" + id }

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
		if strings.ContainsAny(p, ":,") && p != spec.SocketPath && p != spec.StateDir && p != spec.RunnerDir {
			return fmt.Errorf("sandbox %s: overlay path %q has a ':' or ',': %w", spec.ID, p, errdefs.ErrInvalidArgument)
		}
	}
	ids := layerIDs(spec)
	if ids.Size == 0 || spec.UIDMap.Size == 0 || spec.GIDMap.Size == 0 {
		return fmt.Errorf("sandbox %s: empty uid/gid map: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if ids.HostID == 0 || spec.UIDMap.HostID == 0 || spec.GIDMap.HostID == 0 {
		return fmt.Errorf("sandbox %s: sandbox root must not be host root: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	return nil
}

// checkSearchable fails with errdefs.ErrFailedPrecondition unless dir and
// every directory above it that exists let others search them (o+x).
func checkSearchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("gvisor root: directory %s is not searchable by others (mode %04o): runsc's gofer, running as a sandbox's unprivileged root, must reach the bundles below it; chmod o+x it or choose another directory: %w",
				d, fi.Mode().Perm(), errdefs.ErrFailedPrecondition)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}
