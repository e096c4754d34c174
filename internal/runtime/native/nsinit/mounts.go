package nsinit

import (
	"errors"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// resolveSafe makes every lookup below the rootfs refuse symlinks (a
// sandbox may have planted some in its upper dir on an earlier run) and
// anything that escapes the rootfs (CVE-2024-21626 / CVE-2024-45310 class).
const resolveSafe = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Paths masked inside the new procfs, as runc does by default.
var maskedPaths = []string{
	"acpi", "asound", "kcore", "keys", "latency_stats", "timer_list",
	"timer_stats", "sched_debug", "scsi",
}

// Paths of the new procfs made read-only.
var readonlyPaths = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}

// Host device nodes bound into the sandbox's /dev (no mknod in a user ns).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

var devSymlinks = [][2]string{
	{"pts/ptmx", "ptmx"},
	{"/proc/self/fd", "fd"},
	{"/proc/self/fd/0", "stdin"},
	{"/proc/self/fd/1", "stdout"},
	{"/proc/self/fd/2", "stderr"},
}

// setupRootfs attaches the host-built root filesystem (rootFD, a detached
// overlay mount) on top of "/" of the guest's mount namespace, mounts
// /proc, /sys and /dev in it and attaches the runner directory (runnerFD,
// a detached read-only, nosuid, nodev bind mount) at /.agentbox. Nothing
// here resolves a host path: the host's data dir is closed to the
// sandbox's uids.
func setupRootfs(rootFD, runnerFD int) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return &SyscallError{Op: "mount", Target: "/", Flags: unix.MS_REC | unix.MS_PRIVATE, Err: err}
	}
	// Stacked on "/", the overlay is in this namespace's tree (pivot_root
	// needs that); rootFD now refers to its root.
	if err := unix.MoveMount(rootFD, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return &SyscallError{Op: "move_mount", Source: "rootfs", Target: "/", Err: err}
	}
	r := rootfs{fd: rootFD}

	if err := r.mountProc(); err != nil {
		return err
	}
	if err := r.mountSys(); err != nil {
		return err
	}
	if err := r.mountDev(); err != nil {
		return err
	}
	if err := r.mkdirAll(".agentbox", 0o755); err != nil {
		return err
	}
	fd, err := r.open(".agentbox", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(runnerFD, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return &SyscallError{Op: "move_mount", Source: "runner", Target: ".agentbox", Err: err}
	}
	return nil
}

// rootfs performs every lookup relative to an fd of the new root, with
// resolveSafe, and mounts onto the opened target through /proc/self/fd.
type rootfs struct{ fd int }

func (r rootfs) open(rel string, flags int, mode uint32) (int, error) {
	fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: resolveSafe,
	})
	if err != nil {
		return -1, &SyscallError{Op: "openat2", Target: rel, Flags: uintptr(flags), Err: err}
	}
	return fd, nil
}

// mkdirAll creates rel and its parents below the root, refusing symlinks.
func (r rootfs) mkdirAll(rel string, mode uint32) error {
	parent := "."
	for _, part := range strings.Split(path.Clean(rel), "/") {
		if part == "" || part == "." {
			continue
		}
		dfd, err := r.open(parent, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(dfd, part, mode)
		unix.Close(dfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return &SyscallError{Op: "mkdirat", Target: path.Join(parent, part), Err: err}
		}
		parent = path.Join(parent, part)
	}
	// Verify the result is a real directory (EEXIST could be a symlink).
	fd, err := r.open(parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// mkfile creates rel as an empty regular file (a bind-mount target).
func (r rootfs) mkfile(rel string) error {
	fd, err := r.open(rel, unix.O_CREAT|unix.O_RDONLY|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// mount mounts source at rel (which must exist).
func (r rootfs) mount(rel, source, fstype string, flags uintptr, data string) error {
	fd, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(source, fdPath(fd), fstype, flags, data); err != nil {
		return &SyscallError{Op: "mount", Source: source, Target: rel, Flags: flags, Data: data, Err: err}
	}
	return nil
}

// remountRO bind-mounts rel onto itself (unless already a bind) and makes it
// read-only, keeping the flags the kernel locks in a user namespace.
func (r rootfs) remountRO(rel string, extra uintptr) error {
	fd, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return &SyscallError{Op: "fstatfs", Target: rel, Err: err}
	}
	locked := uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
		unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
	flags := unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | locked | extra
	if err := unix.Mount("", fdPath(fd), "", flags, ""); err != nil {
		return &SyscallError{Op: "mount", Target: rel, Flags: flags, Err: err}
	}
	return nil
}

func (r rootfs) mountProc() error {
	if err := r.mkdirAll("proc", 0o555); err != nil {
		return err
	}
	if err := r.mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for _, p := range maskedPaths {
		rel := "proc/" + p
		fd, err := r.open(rel, unix.O_PATH, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return err
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return &SyscallError{Op: "fstat", Target: rel, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = r.mount(rel, "tmpfs", "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
		} else {
			err = r.mount(rel, "/dev/null", "", unix.MS_BIND, "")
		}
		if err != nil {
			return err
		}
	}
	for _, p := range readonlyPaths {
		rel := "proc/" + p
		if err := r.bindSelf(rel); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return err
		}
		if err := r.remountRO(rel, 0); err != nil {
			return err
		}
	}
	return nil
}

// bindSelf bind-mounts rel onto itself, so it can be remounted alone.
func (r rootfs) bindSelf(rel string) error {
	fd, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(fdPath(fd), fdPath(fd), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return &SyscallError{Op: "mount", Source: rel, Target: rel, Flags: unix.MS_BIND | unix.MS_REC, Err: err}
	}
	return nil
}

func (r rootfs) mountSys() error {
	if err := r.mkdirAll("sys", 0o555); err != nil {
		return err
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := r.mount("sys", "sysfs", "sysfs", flags, ""); err != nil {
		// sysfs needs a network namespace we own; fall back to nothing.
		return r.mount("sys", "tmpfs", "tmpfs", flags, "size=0")
	}
	return nil
}

func (r rootfs) mountDev() error {
	if err := r.mkdirAll("dev", 0o755); err != nil {
		return err
	}
	if err := r.mount("dev", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return err
	}
	for _, d := range devices {
		rel := "dev/" + d
		if err := r.mkfile(rel); err != nil {
			return err
		}
		if err := r.mount(rel, "/dev/"+d, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := r.mkdirAll("dev/pts", 0o755); err != nil {
		return err
	}
	ptsFlags := uintptr(unix.MS_NOSUID | unix.MS_NOEXEC)
	if err := r.mount("dev/pts", "devpts", "devpts", ptsFlags, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		// gid 5 may be unmapped; the group then stays root's.
		if err := r.mount("dev/pts", "devpts", "devpts", ptsFlags, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
			return err
		}
	}
	if err := r.mkdirAll("dev/shm", 0o1777); err != nil {
		return err
	}
	if err := r.mount("dev/shm", "shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return err
	}
	dev, err := r.open("dev", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	for _, l := range devSymlinks {
		if err := unix.Symlinkat(l[0], dev, l[1]); err != nil {
			return &SyscallError{Op: "symlinkat", Source: l[0], Target: "dev/" + l[1], Err: err}
		}
	}
	return nil
}

// pivotRoot makes the mount rootFD refers to the root with runc's
// pivot_root(".", ".") trick: the old root ends up stacked under the new
// one and is lazily detached.
func pivotRoot(rootFD int) error {
	if err := unix.Fchdir(rootFD); err != nil {
		return &SyscallError{Op: "fchdir", Target: "rootfs", Err: err}
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return &SyscallError{Op: "pivot_root", Target: "rootfs", Err: err}
	}
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return &SyscallError{Op: "mount", Target: "old root", Flags: unix.MS_SLAVE | unix.MS_REC, Err: err}
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return &SyscallError{Op: "umount2", Target: "old root", Flags: unix.MNT_DETACH, Err: err}
	}
	if err := unix.Chdir("/"); err != nil {
		return &SyscallError{Op: "chdir", Target: "/", Err: err}
	}
	return nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
