package nsinit

import (
	"syscall"

	"golang.org/x/sys/unix"
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

// noCoreDumps sets RLIMIT_CORE to 0, soft and hard, for the guest and so
// for every process of the sandbox. A core file is written where the
// crashing process runs, readable by the sandbox's other processes of its
// uid, and would carry the memory of a private process (secrets in its
// environment) to any process that can signal it; nothing in a sandbox
// holds CAP_SYS_RESOURCE to raise the hard limit again, for itself or
// (prlimit) for another process. (A host whose core_pattern pipes cores to
// a helper ignores the limit; such cores go to the host, not the sandbox.)
func noCoreDumps() error {
	if err := syscall.Setrlimit(unix.RLIMIT_CORE, &syscall.Rlimit{}); err != nil {
		return &SyscallError{Op: "setrlimit", Target: "RLIMIT_CORE", Err: err}
	}
	return nil
}
