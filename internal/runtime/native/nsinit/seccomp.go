package nsinit

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM for every sandbox process: in the spirit of
// Docker's default profile, the calls that reach kernel attack surface or
// undo the isolation (mounts, namespaces, keyrings, io_uring, bpf, modules,
// clocks, ptrace, ...).
var deniedSyscalls = []string{
	"mount", "umount2", "pivot_root", "unshare", "setns",
	"keyctl", "add_key", "request_key",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"kexec_load", "kexec_file_load", "bpf", "perf_event_open", "userfaultfd",
	"open_by_handle_at", "name_to_handle_at",
	"init_module", "finit_module", "delete_module", "create_module",
	"get_kernel_syms", "query_module",
	"acct", "swapon", "swapoff", "reboot",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"syslog", "quotactl", "lookup_dcookie",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	"ptrace", "process_vm_readv", "process_vm_writev",
	"vhangup", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
	"iopl", "ioperm",
}

// cloneNamespaceFlags are the clone(2) flags that create namespaces.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP |
	unix.CLONE_NEWTIME

// allowedPersonalities are the personality(2) arguments Docker allows:
// PER_LINUX, PER_LINUX32, UNAME26 variants and the 0xffffffff query.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// Policy returns the seccomp policy applied to every sandbox process.
//
// clone3 is allowed although its flags are in a struct seccomp cannot
// inspect: the guest needs it to start each exec inside its own cgroup
// (CLONE_INTO_CGROUP), and the filter is shared by the guest and every
// process it starts. The namespaces clone3 could create are refused by the
// kernel instead: all but a user namespace need CAP_SYS_ADMIN, which no
// sandbox process holds, and the sandbox's user namespace allows no nested
// namespace at all (user.max_*_namespaces are 0 in it, set by
// forbidNamespaces while the guest still could, and unchangeable without
// CAP_SYS_RESOURCE).
func Policy() seccomp.Policy {
	personality := make([]seccomp.Condition, 0, len(allowedPersonalities))
	for _, p := range allowedPersonalities {
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: p})
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: deniedSyscalls},
			{
				Action: seccomp.ActionErrno,
				NamesWithCondtions: []seccomp.NameWithConditions{
					// clone(flags, ...) on x86_64: flags is argument 0.
					{Name: "clone", Conditions: seccomp.ArgumentConditions{
						{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaceFlags},
					}},
					{Name: "personality", Conditions: personality},
				},
			},
		},
	}
}

// loadSeccomp installs Policy on every thread (TSYNC).
func loadSeccomp() error {
	f := seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: Policy()}
	if err := seccomp.LoadFilter(f); err != nil {
		return fmt.Errorf("loading seccomp filter: %w", err)
	}
	return nil
}
