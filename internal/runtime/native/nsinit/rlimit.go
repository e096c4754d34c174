package nsinit

import (
	"syscall"
)

// limitOpenFiles sets RLIMIT_NOFILE (soft and hard) to n, capped at the
// current hard limit (raising it needs CAP_SYS_RESOURCE, which the host may
// not have either). Every process the guest starts inherits it: the
// syscall package's Setrlimit also stops os/exec from restoring the
// pre-start soft limit in children. n == 0 does nothing.
func limitOpenFiles(n uint64) error {
	if n == 0 {
		return nil
	}
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
		return &SyscallError{Op: "getrlimit", Target: "RLIMIT_NOFILE", Err: err}
	}
	n = min(n, cur.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
		return &SyscallError{Op: "setrlimit", Target: "RLIMIT_NOFILE", Err: err}
	}
	return nil
}
