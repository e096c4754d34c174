package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
)

// A sandbox's bundle is a directory of its own under the backend's root,
// <Root>/b/<id>, which runsc's gofer can traverse (0711 all the way: the
// gofer runs as the sandbox's mapped root, an unprivileged host uid, and
// opens its mount sources by path, so nothing it opens may sit under the
// daemon's 0700 data dir):
//
//	config.json  the OCI spec (0600)
//	pid          the sandbox process's pid, written by runsc run
//	rootfs/      the sandbox's overlay (Layers, UpperDir, WorkDir), mounted by the host
//	runner/      a read-only bind of RunnerDir, mounted at /.agentbox
//	u/           the guest socket's directory, at gvinit.SocketDir
//
// The two mounts are attached in the host's mount namespace and detached
// again by Destroy and Cleanup, which find them from the id alone.
const (
	bundleRootfs = "rootfs"
	bundleRunner = "runner"
	bundleSocket = "u"
	// ctlSocket is the guest's control socket once claimed (gvinit.CtlName).
	ctlSocket = "ctl.sock"
)

// guestEnv is the guest's environment (sandbox processes get their own
// from each exec).
var guestEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"GOMAXPROCS=1",
}

// defaultCaps is Docker's default capability set without CAP_MKNOD and
// CAP_NET_RAW, as native gives its sandboxes (nsinit.DefaultCaps): the
// only capabilities a sandbox process can hold. Under gVisor they are
// capabilities of the sentry's kernel, not the host's.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths are runc's defaults. The sentry's /proc
// and /sys are its own and show nothing of the host's, but a sandbox sees
// the same masks under both backends.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// ociSpec returns the OCI runtime spec of a sandbox whose bundle is bdir.
// Its user namespace maps the sandbox's ids onto the range its files are
// owned by on disk (Spec.LayerIDs): runsc runs its gofer in it, so a file
// owned by LayerIDs.HostID on disk is root's inside, and what the sandbox
// writes is stored in that range.
func ociSpec(spec runtime.Spec, bdir, cgroupsPath string) *specs.Spec {
	ids := layerIDs(spec)
	rootfs := filepath.Join(bdir, bundleRootfs)
	process := &specs.Process{
		User:            specs.User{UID: 0, GID: 0},
		Args:            append([]string{"/.agentbox/agentbox"}, gvinit.Args...),
		Env:             guestEnv,
		Cwd:             "/",
		NoNewPrivileges: true,
		Capabilities: &specs.LinuxCapabilities{
			Bounding:  defaultCaps,
			Effective: defaultCaps,
			Permitted: defaultCaps,
		},
	}
	if n := spec.Resources.OpenFiles; n > 0 {
		process.Rlimits = append(process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: uint64(n), Soft: uint64(n)})
	}
	// The pids limit is the sentry's: RLIMIT_NPROC, which it enforces on
	// every task of a user without CAP_SYS_ADMIN or CAP_SYS_RESOURCE (no
	// sandbox process has them), so a fork bomb gets EAGAIN inside as
	// under native. The host cgroup's pids.max (resources) is a backstop
	// with room for the sentry's and the gofer's own threads: reached, it
	// would fail the sentry's thread creation and kill the whole sandbox.
	if n := spec.Resources.PidsMax; n > 0 {
		process.Rlimits = append(process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(n), Soft: uint64(n)})
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/.agentbox", Type: "bind", Source: filepath.Join(bdir, bundleRunner), Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		{Destination: gvinit.SocketDir, Type: "bind", Source: filepath.Join(bdir, bundleSocket), Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
	}
	// runsc mounts a tmpfs of its own on an empty /tmp unless /tmp is a
	// mount of the spec: bind the overlay's own, so /tmp is part of the
	// sandbox's filesystem (and of its checkpoints) as under native.
	if fi, err := os.Lstat(filepath.Join(rootfs, "tmp")); err == nil && fi.IsDir() {
		mounts = append(mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(rootfs, "tmp"), Options: []string{"rbind", "rw"}})
	}
	idmap := func(m runtime.IDMap) []specs.LinuxIDMapping {
		return []specs.LinuxIDMapping{{ContainerID: 0, HostID: m.HostID, Size: m.Size}}
	}
	return &specs.Spec{
		Version:  specs.Version,
		Process:  process,
		Root:     &specs.Root{Path: rootfs},
		Hostname: spec.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace},
			},
			UIDMappings:   idmap(ids),
			GIDMappings:   idmap(ids),
			CgroupsPath:   cgroupsPath,
			Resources:     resources(spec.Resources),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
}

// resources maps the sandbox's limits onto the OCI spec's, which runsc
// applies to the sandbox's host cgroup (the sentry and gofer are its
// processes) and the sentry to its own view of memory. The pids limit is
// the backstop of hostPidsLimit; the sandbox's own is RLIMIT_NPROC.
func resources(r runtime.Resources) *specs.LinuxResources {
	out := &specs.LinuxResources{}
	if r.CPUs > 0 {
		period := uint64(100000)
		quota := int64(r.CPUs * float64(period))
		out.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if r.MemoryBytes > 0 {
		limit := r.MemoryBytes
		out.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if r.PidsMax > 0 {
		limit := hostPidsLimit(r.PidsMax)
		out.Pids = &specs.LinuxPids{Limit: &limit}
	}
	return out
}

// hostPidsLimit is the host cgroup's pids.max of a sandbox whose pids limit
// is n (enforced inside by the sentry, RLIMIT_NPROC): room for n tasks with
// a host thread each (systrap runs every task on a stub thread), and for
// the sentry's and the gofer's own threads.
func hostPidsLimit(n int64) int64 { return 2*n + 256 }

// layerIDs is the range spec's files are owned by on disk.
func layerIDs(spec runtime.Spec) runtime.IDMap {
	if spec.LayerIDs.Size == 0 {
		return spec.UIDMap
	}
	return spec.LayerIDs
}

// writeSpec writes s as bdir/config.json.
func writeSpec(bdir string, s *specs.Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bdir, "config.json"), b, 0o600)
}

// mountRootfs mounts spec's overlay at bdir/rootfs and a read-only bind of
// its runner dir at bdir/runner, both private (nothing propagates into or
// out of them). The overlay takes user xattrs, as native's does, so an
// upper dir means the same under both backends.
func mountRootfs(spec runtime.Spec, bdir string) error {
	rootfs, runner := filepath.Join(bdir, bundleRootfs), filepath.Join(bdir, bundleRunner)
	for _, d := range []string{rootfs, runner} {
		if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	opts := "lowerdir="
	for i, l := range spec.Layers {
		if i > 0 {
			opts += ":"
		}
		opts += l
	}
	opts += ",upperdir=" + spec.UpperDir + ",workdir=" + spec.WorkDir + ",userxattr"
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("overlay options of %d layers exceed a page: %w", len(spec.Layers), errInvalid)
	}
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return &mountError{op: "mount overlay", path: rootfs, err: err}
	}
	if err := unix.Mount("", rootfs, "", unix.MS_PRIVATE, ""); err != nil {
		return &mountError{op: "make private", path: rootfs, err: err}
	}
	if err := unix.Mount(spec.RunnerDir, runner, "", unix.MS_BIND, ""); err != nil {
		return &mountError{op: "bind", path: runner, err: err}
	}
	if err := unix.Mount("", runner, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return &mountError{op: "remount read-only", path: runner, err: err}
	}
	if err := unix.Mount("", runner, "", unix.MS_PRIVATE, ""); err != nil {
		return &mountError{op: "make private", path: runner, err: err}
	}
	return nil
}

// unmountBundle detaches whatever is mounted on bdir's rootfs and runner
// (each possibly several times over) and removes bdir. Idempotent.
// It removes nothing under a mount point that it could not detach.
func unmountBundle(bdir string) error {
	var errs []error
	for _, name := range []string{bundleRunner, bundleRootfs} {
		p := filepath.Join(bdir, name)
		for range 8 {
			err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			if err == unix.EINVAL || err == unix.ENOENT {
				break // not a mount point (any more)
			}
			if err != nil {
				errs = append(errs, &mountError{op: "unmount", path: p, err: err})
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Never RemoveAll over the mount points: were the overlay still
	// attached, that would empty the sandbox's upper dir. rmdir fails on
	// anything left in them instead.
	for _, f := range []string{"config.json", "pid", ctlSocket} {
		if err := os.Remove(filepath.Join(bdir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(bdir, bundleSocket)); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []string{filepath.Join(bdir, bundleRootfs), filepath.Join(bdir, bundleRunner), bdir} {
		if err := unix.Rmdir(p); err != nil && err != unix.ENOENT {
			errs = append(errs, &mountError{op: "rmdir", path: p, err: err})
		}
	}
	return errors.Join(errs...)
}

// mountError is a failed mount syscall.
type mountError struct {
	op, path string
	err      error
}

func (e *mountError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *mountError) Unwrap() error { return e.err }
