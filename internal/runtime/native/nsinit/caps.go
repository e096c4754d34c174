package nsinit

import (
	"errors"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultCaps is Docker's default capability set without CAP_MKNOD and
// CAP_NET_RAW: the only capabilities a sandbox process can ever hold
// (bounding, permitted and effective sets). No device node a sandbox could
// make is of use to it (its /dev is bind-mounted from a fixed list), and
// raw sockets serve only packet forging and sniffing: ICMP echo works
// without them through datagram ICMP sockets (net.ipv4.ping_group_range
// is opened to every gid of the sandbox, see allowPing).
var DefaultCaps = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER,
	unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_SETFCAP, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
	unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

// DefaultCapMask is DefaultCaps as a bit mask, as shown in CapBnd of
// /proc/<pid>/status.
func DefaultCapMask() uint64 {
	var m uint64
	for _, c := range DefaultCaps {
		m |= 1 << c
	}
	return m
}

// syscallAllThreads runs a syscall on every thread of the process. It needs
// a binary built with CGO_ENABLED=0.
func syscallAllThreads(trap, a1, a2, a3 uintptr) (uintptr, uintptr, syscall.Errno) {
	return syscall.AllThreadsSyscall(trap, a1, a2, a3)
}

func lastCap() uintptr {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return uintptr(n)
		}
	}
	return unix.CAP_LAST_CAP
}

// setupCaps are the capabilities setup needs beyond DefaultCaps (mounts,
// pivot_root, sethostname, unshare; bringing lo up). They are the last to be
// dropped, after setup.
const setupCaps = 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_NET_ADMIN

// dropBounding removes every capability outside keep from the bounding set
// of every thread. Each drop stops the world (AllThreadsSyscall), so
// capabilities already gone (read on this thread: all threads share one
// bounding set here) are skipped; dropEarly does most of the work before
// the guest's config arrives, off the create path. (A new user namespace
// starts with a full bounding set whatever its creator's, so the host
// cannot hand the guest a trimmed one.)
func dropBounding(keep uint64) error {
	last := lastCap()
	for c := uintptr(0); c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0); err == nil && in == 0 {
			continue
		}
		if _, _, e := syscallAllThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); e != 0 && !errors.Is(e, unix.EINVAL) {
			return &SyscallError{Op: "prctl", Target: "PR_CAPBSET_DROP " + strconv.Itoa(int(c)), Err: e}
		}
	}
	return nil
}

// dropEarly trims the bounding set to DefaultCaps plus setupCaps and
// clears the ambient set. It runs before the config is read, so a
// prespawned guest has done it by the time a sandbox claims it.
func dropEarly() error {
	if err := dropBounding(DefaultCapMask() | setupCaps); err != nil {
		return err
	}
	return clearAmbient()
}

// clearAmbient empties the ambient set of every thread, unless it is empty
// on this one, and so on all: every thread here inherits it from the
// first, and nothing else sets it. It always is in a guest (a new user
// namespace starts with an empty one), which is spared two stop-the-worlds.
func clearAmbient() error {
	if ambientEmpty() {
		return nil
	}
	if _, _, e := syscallAllThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 && !errors.Is(e, unix.EINVAL) {
		return &SyscallError{Op: "prctl", Target: "PR_CAP_AMBIENT_CLEAR_ALL", Err: e}
	}
	return nil
}

// ambientEmpty reports whether this thread's ambient set is empty; false
// when the kernel cannot say.
func ambientEmpty() bool {
	last := lastCap()
	for c := uintptr(0); c <= last; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, c, 0, 0)
		if err != nil || in != 0 {
			return false
		}
	}
	return true
}

// dropCapabilities limits every thread to DefaultCaps: bounding set,
// ambient set cleared, permitted and effective set to DefaultCaps and an
// empty inheritable set (as Docker does since CVE-2022-24769).
func dropCapabilities() error {
	mask := DefaultCapMask()
	if err := dropBounding(mask); err != nil {
		return err
	}
	if err := clearAmbient(); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(mask), Permitted: uint32(mask)},
		{Effective: uint32(mask >> 32), Permitted: uint32(mask >> 32)},
	}
	_, _, e := syscallAllThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	goruntime.KeepAlive(&hdr)
	goruntime.KeepAlive(&data)
	if e != 0 {
		return &SyscallError{Op: "capset", Err: e}
	}
	return nil
}

// applySecurity applies the posture every later process inherits:
// capabilities, no_new_privs, non-dumpable guest, seccomp filter.
func applySecurity() error {
	if err := dropCapabilities(); err != nil {
		return err
	}
	if _, _, e := syscallAllThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		return &SyscallError{Op: "prctl", Target: "PR_SET_NO_NEW_PRIVS", Err: e}
	}
	// Non-dumpable: sandbox processes cannot open /proc/1/mem, /proc/1/fd/...
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return &SyscallError{Op: "prctl", Target: "PR_SET_DUMPABLE", Err: err}
	}
	return loadSeccomp()
}
