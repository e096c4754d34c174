package guest

import (
	"errors"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Private processes: whose environment and memory the sandbox's other
// processes cannot read.
//
// Every process the guest starts lives in a Landlock domain, and Landlock
// lets a process in a domain reach another process through the ptrace
// access checks (/proc/<pid>/environ, mem, maps, fd, cwd, root, exe,
// map_files, auxv; ptrace; process_vm_readv; pidfd_getfd) only when the
// target is in the same domain or one nested below it. Plain execs are
// all started in one shared domain, so they see each other as before (lsof,
// ss -p, /proc/<pid>/environ across execs; ptrace itself is denied to
// every sandbox process by the seccomp filter). A private exec (ExecRequest.Private, set
// for every exec given secrets or a run token) is started in a fresh
// domain of its own, which no other exec's domain encloses: no process of
// the sandbox but the private process's own descendants can read its
// environment, memory or descriptors, whatever its uid (root inside
// included). This rests on no sandbox process holding CAP_SYS_PTRACE (it
// is not in nsinit.DefaultCaps): a tracer that holds it is let through by
// Landlock (seen on Linux 6.18), and by the dumpable check too. A process
// cannot leave its domain.
//
// The domains restrict nothing else: they handle only the "refer" file
// access right (without which Landlock would refuse renames across
// directories), granted again beneath "/". They need Landlock ABI 2 (Linux
// 5.19) and a kernel with Landlock enabled; without it, privacy rests on
// the core-dump limit alone (nsinit sets RLIMIT_CORE to 0, hard) and the
// guest logs a warning once.
//
// Not protected, whatever the kernel: /proc/<pid>/cmdline and status
// (readable by every process: never put a secret in argv); a process of
// the sandbox that, before the private exec starts, replaced the binary it
// runs or a library it loads (root inside can write the whole filesystem)
// or that reads what the private process writes to files, pipes or
// sockets; signals (another exec may kill a private process).
//
// Landlock domains are per thread: the guest forks plain execs from one
// OS thread that entered the shared domain when the guest started, and
// each private exec from a fresh thread that enters a new domain, forks,
// and is then discarded (a goroutine that exits locked to its thread takes
// the thread with it; the Go runtime never creates threads from a locked
// one).
type domains struct {
	log *slog.Logger
	// plain carries fork requests to the shared domain's thread; nil when
	// domains are unavailable.
	plain chan forkRequest
	root  int // O_PATH descriptor of "/", for the refer rule
}

type forkRequest struct {
	fork func() (int, error)
	res  chan forkResult
}

type forkResult struct {
	pid int
	err error
}

// landlockABI is the Landlock ABI version needed: 2 brought the refer
// right, without which a domain cannot allow cross-directory renames.
const landlockABI = 2

// newDomains starts the shared domain's thread. Without a usable Landlock
// it logs why and returns domains that start every process outside any
// domain.
func newDomains(log *slog.Logger) *domains {
	d := &domains{log: log, root: -1}
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 || int(abi) < landlockABI {
		log.Warn("Landlock unavailable: private processes are not shielded from the sandbox's other processes", "abi", int(abi), "err", errnoErr(errno))
		return d
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		log.Warn("Landlock unusable: private processes are not shielded", "err", err)
		return d
	}
	d.root = root
	ready := make(chan error, 1)
	plain := make(chan forkRequest)
	go func() {
		goruntime.LockOSThread() // for good: the thread carries the domain
		if err := d.enter(); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for req := range plain {
			pid, err := req.fork()
			req.res <- forkResult{pid, err}
		}
	}()
	if err := <-ready; err != nil {
		log.Warn("Landlock unusable: private processes are not shielded", "err", err)
		return d
	}
	d.plain = plain
	return d
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// enter puts the calling thread in a new Landlock domain that restricts
// nothing but ptrace-like access to processes outside it.
func (d *domains) enter() error {
	// struct landlock_ruleset_attr up to handled_access_fs (ABI 1 size).
	attr := struct{ handledAccessFS uint64 }{unix.LANDLOCK_ACCESS_FS_REFER}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	rule := unix.LandlockPathBeneathAttr{Allowed_access: unix.LANDLOCK_ACCESS_FS_REFER, Parent_fd: int32(d.root)}
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_add_rule: %w", errno)
	}
	// The thread has no_new_privs (nsinit set it on every thread).
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return nil
}

// errNoDomain is returned for a private exec whose domain could not be
// made although Landlock works: it is not started unshielded.
var errNoDomain = errors.New("no Landlock domain for a private process")

// fork runs fork (a fork and exec) in the shared domain, or in a fresh
// domain of its own when private. Without Landlock it runs fork directly
// (newDomains logged that private processes are then not shielded).
func (d *domains) fork(private bool, fork func() (int, error)) (int, error) {
	if d.plain == nil {
		return fork()
	}
	res := make(chan forkResult, 1)
	if !private {
		d.plain <- forkRequest{fork: fork, res: res}
		r := <-res
		return r.pid, r.err
	}
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := d.enter(); err != nil {
			res <- forkResult{0, fmt.Errorf("%w: %w", errNoDomain, err)}
			return
		}
		pid, err := fork()
		res <- forkResult{pid, err}
	}()
	r := <-res
	return r.pid, r.err
}
