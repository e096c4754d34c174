package nsinit

import (
	"fmt"
	"strings"
)

// SyscallError is a failed system call during guest setup, with the
// operation, the paths involved and the flags, in the manner of runc's
// mountError. It unwraps to the errno, so errors.Is(err, unix.EPERM) works.
type SyscallError struct {
	Op     string  // "mount", "openat2", "pivot_root", ...
	Source string  // mount source, if any
	Target string  // path the call was about (relative to the rootfs where it applies)
	Flags  uintptr // call flags, if any
	Data   string  // mount data, if any
	Err    error
}

func (e *SyscallError) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Source != "" {
		fmt.Fprintf(&b, " %s", e.Source)
	}
	if e.Target != "" {
		if e.Source != "" {
			b.WriteString(" to")
		}
		fmt.Fprintf(&b, " %s", e.Target)
	}
	if e.Flags != 0 {
		fmt.Fprintf(&b, " (flags %#x)", e.Flags)
	}
	if e.Data != "" {
		fmt.Fprintf(&b, " (data %q)", truncate(e.Data, 200))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *SyscallError) Unwrap() error { return e.Err }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
