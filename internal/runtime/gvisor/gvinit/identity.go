package gvinit

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Only PID 1 can set the sandbox's hostname: it is the one task of the
// sandbox that holds CAP_SYS_ADMIN. The sentry computes an exec's
// capabilities as Linux does: a root process's permitted set after an
// exec is its bounding set and its inheritable set. The backend's OCI
// spec puts CAP_SYS_ADMIN in the guest's inheritable set only (never in
// the bounding set), so that the exec of the guest itself keeps it, and
// the guest takes it out of its inheritable set first thing
// (dropInheritable), on every thread: no program it starts can get it
// back. Every other process has Docker's default set, without it, as
// under native.

// dropInheritable empties the inheritable capability set of every thread
// of this process, keeping the permitted and effective sets.
func dropInheritable() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	hdr.Pid = 0
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	return nil
}

// ValidHostname reports whether name may be a sandbox's hostname: 1 to
// 64 bytes of letters, digits, '-' and '.' (what the host ever sends: a
// sandbox id).
func ValidHostname(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// setHostname sets the sandbox's hostname (its UTS namespace's, which is
// every sandbox process's) to name and returns the control socket's
// answer: HostnameReply, or "error: ...".
func setHostname(name string) string {
	if !ValidHostname(name) {
		return fmt.Sprintf("error: invalid hostname %q\n", name)
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Sprintf("error: sethostname: %v\n", err)
	}
	return HostnameReply
}
