// Package nsinit is the first stage of the guest, running as PID 1 inside the
// namespaces the native backend created (user, mount, pid, uts, ipc, net,
// cgroup). It builds the sandbox's root filesystem from overlay layers,
// mounts /proc, /sys, /dev and the runner directory at /.agentbox, pivots
// into it, applies the security posture every later process inherits
// (capability bounding set, no_new_privs, seccomp) and then hands the
// listening socket to the guest server.
//
// Protocol with the host (package native): fd 3 is the listening unix
// socket, fd 4 a SOCK_SEQPACKET socket carrying one message: a JSON Config
// with two descriptors (SCM_RIGHTS), the sandbox's root filesystem and the
// runner directory, both detached mounts the host built (open_tree,
// fsmount); fd 5 a pipe on which Main reports "ok" or a JSON SyncMessage
// with the setup error. Main does not start setup before the config has
// arrived, which the host sends only after the process is in its cgroup.
//
// The guest never resolves a host path: it runs as the sandbox's root, an
// unprivileged host uid, and the host's data dir is closed to such uids
// (0700). It attaches the two mounts it was handed inside its own mount
// namespace.
package nsinit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SetupVersion is the version of this host<->guest setup protocol, which a
// runner's self-check reports (runner.Report.Setup): 2 is the config
// socket with the mount descriptors; 1 (unreported) had the guest mount
// host paths itself. A daemon starts only guests of its own version.
const SetupVersion = 2

// File descriptors the host passes to the guest.
const (
	ListenerFD = 3
	ConfigFD   = 4
	SyncFD     = 5
)

// What Main writes on SyncFD: SyncWaiting once it is ready to read its
// config (a prespawned guest is claimed only after that), then syncOK once
// setup is complete, or a SyncMessage.
const (
	SyncWaiting = "w"
	syncOK      = "ok"
)

// Config is the setup the host sends on ConfigFD, beside the descriptors
// of ConfigFDs.
type Config struct {
	Hostname string `json:"hostname"`
	// OpenFiles is RLIMIT_NOFILE of the guest and so of every process it
	// starts (0: inherited).
	OpenFiles uint64 `json:"open_files,omitempty"`
	// ExecCgroups says the guest was born in a cgroup v2 cgroup the host
	// delegated to the sandbox's root: the guest makes its per-exec
	// cgroups in it (see ExecCgroupDir).
	ExecCgroups bool `json:"exec_cgroups,omitempty"`
}

// The descriptors that travel with the Config, in this order: the root
// filesystem (a detached overlay mount) and the runner directory (a
// detached read-only bind mount, attached at /.agentbox).
const (
	RootfsIndex = iota
	RunnerIndex
	ConfigFDs
)

// maxConfig bounds the config message.
const maxConfig = 64 << 10

// SyncMessage is the failure report written on SyncFD.
type SyncMessage struct {
	Error string `json:"error"`
}

// ReadSync reads the guest's setup report from r until EOF and returns nil
// when the guest reported success. The report is untrusted; it is only ever
// quoted in an error message.
func ReadSync(r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if err != nil {
		return fmt.Errorf("reading guest setup result: %w", err)
	}
	b = []byte(strings.TrimPrefix(string(b), SyncWaiting))
	if string(b) == syncOK {
		return nil
	}
	if len(b) == 0 {
		return errors.New("guest exited before reporting setup result")
	}
	var m SyncMessage
	if err := json.Unmarshal(b, &m); err != nil || m.Error == "" {
		return fmt.Errorf("guest setup failed: unreadable report %q", truncate(string(b), 200))
	}
	return fmt.Errorf("guest setup failed: %s", truncate(m.Error, 4096))
}

// Main runs the setup, then serve with the listener received on fd 3. It
// never returns: it exits 1 if setup or serve fails. It must be called from
// the guest binary's main goroutine, built with CGO_ENABLED=0 (the security
// posture is applied to every thread with syscall.AllThreadsSyscall).
func Main(serve func(ln net.Listener) error) {
	ln, err := setup()
	if err != nil {
		report(err)
		os.Exit(1)
	}
	reserveThreads(spareThreads)
	if err := serve(ln); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox guest: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// spareThreads is how many idle OS threads the guest keeps beyond those
// setup left it with: with four, serving on one P, a fork bomb at pids.max
// still killed the guest about one run in fifty; eight give it more
// threads than it had serving on every P, where that never happened.
const spareThreads = 8

// reserveThreads makes the Go runtime start n more OS threads and leaves
// them idle: the runtime reuses idle threads before it creates one, and
// never ends them. The guest lives in its sandbox's cgroup, so once the
// sandbox's processes reach pids.max (a fork bomb) no thread can be
// created, and the runtime dies when it needs one (a blocking syscall
// while another goroutine is runnable): serving on one P, the guest has
// few threads of its own. Each goroutine locks a thread of its own and
// waits until all n are locked, so the n threads are distinct; unlocked
// and done, they go idle. It runs after setup, whose AllThreadsSyscalls
// then stop fewer threads; new threads inherit the security posture of
// the thread that creates them.
func reserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			goruntime.LockOSThread()
			locked.Done()
			<-release
			goruntime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

func report(setupErr error) {
	fmt.Fprintf(os.Stderr, "agentbox guest init: %v\n", setupErr)
	b, _ := json.Marshal(SyncMessage{Error: setupErr.Error()})
	_, _ = unix.Write(SyncFD, b)
	_ = unix.Close(SyncFD)
}

func setup() (net.Listener, error) {
	// One P, for good. Setup is one goroutine's syscalls, and every
	// syscallAllThreads below stops fewer threads. Serving, the guest's
	// work is one exec or file call at a time, mostly waiting: on more Ps
	// the Go runtime wakes other threads to spin for work at every hand-off
	// between goroutines (four times the context switches per exec), each
	// of them a wake-up that waits for a CPU when the sandbox's neighbours
	// keep the CPUs busy. The runtime still hands the P to another thread
	// during a long syscall, and dies when it cannot create one (a fork
	// bomb at pids.max): reserveThreads keeps spare ones. The host starts
	// the guest with GOMAXPROCS=1 in its environment (no stop-the-world
	// here then, and no threads started for other Ps).
	goruntime.GOMAXPROCS(1)
	// Anything beyond our protocol fds was leaked by the host: drop it
	// before touching the filesystem.
	closeExtraFDs(map[int]bool{ListenerFD: true, ConfigFD: true, SyncFD: true})
	// The host executed us through a descriptor (/proc/self/fd/N), which
	// names the process "N"; name it after the binary again.
	_ = os.WriteFile("/proc/self/comm", []byte("agentbox"), 0)

	// Most of the capability work happens before the config arrives: a
	// prespawned guest has it done before a sandbox claims it.
	if err := dropEarly(); err != nil {
		return nil, err
	}
	// A prespawned guest keeps only the host directories it will need
	// while it waits (see keepOnly).
	kept, err := keepFromEnv()
	if err != nil {
		return nil, err
	}
	if kept != nil {
		if err := keepOnly(kept); err != nil {
			return nil, err
		}
	}
	if _, err := unix.Write(SyncFD, []byte(SyncWaiting)); err != nil {
		return nil, &SyscallError{Op: "write", Target: "sync fd", Err: err}
	}
	cfg, fds, err := readConfig()
	if err != nil {
		return nil, err
	}
	// The host has placed us in the sandbox cgroup by now; a fresh cgroup
	// namespace makes that cgroup the root of what the sandbox sees. unshare
	// is per thread, so it runs on every thread of this process (each gets
	// an equivalent namespace rooted at the same cgroup).
	if _, _, errno := syscallAllThreads(unix.SYS_UNSHARE, unix.CLONE_NEWCGROUP, 0, 0); errno != 0 {
		return nil, &SyscallError{Op: "unshare", Target: "CLONE_NEWCGROUP", Err: errno}
	}
	if cfg.ExecCgroups {
		if err := openExecCgroup(); err != nil {
			return nil, err
		}
	}
	if err := setupRootfs(fds[RootfsIndex], fds[RunnerIndex]); err != nil {
		return nil, err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return nil, &SyscallError{Op: "sethostname", Target: cfg.Hostname, Err: err}
		}
	}
	if err := limitOpenFiles(cfg.OpenFiles); err != nil {
		return nil, err
	}
	if err := noCoreDumps(); err != nil {
		return nil, err
	}
	if err := loopbackUp(); err != nil {
		return nil, err
	}
	if err := allowPing(); err != nil {
		return nil, err
	}
	// Last of the namespaces made; before the pivot, which leaves a
	// read-only /proc/sys.
	if err := forbidNamespaces(); err != nil {
		return nil, err
	}
	if err := pivotRoot(fds[RootfsIndex]); err != nil {
		return nil, err
	}
	if err := applySecurity(); err != nil {
		return nil, err
	}

	lf := os.NewFile(ListenerFD, "listener")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return nil, fmt.Errorf("listener on fd %d: %w", ListenerFD, err)
	}
	keep := map[int]bool{SyncFD: true}
	if execCgroup != nil {
		keep[int(execCgroup.Fd())] = true
	}
	fd, err := listenerFD(ln)
	if err != nil {
		ln.Close()
		return nil, err
	}
	keep[fd] = true
	closeExtraFDs(keep)

	if _, err := unix.Write(SyncFD, []byte(syncOK)); err != nil {
		ln.Close()
		return nil, &SyscallError{Op: "write", Target: "sync fd", Err: err}
	}
	_ = unix.Close(SyncFD)
	return ln, nil
}

// readConfig receives the config message from ConfigFD and returns the
// config with its ConfigFDs descriptors (close-on-exec).
func readConfig() (*Config, []int, error) {
	defer unix.Close(ConfigFD)
	buf := make([]byte, maxConfig)
	oob := make([]byte, unix.CmsgSpace(4*(ConfigFDs+1)))
	n, oobn, _, _, err := unix.Recvmsg(ConfigFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, &SyscallError{Op: "recvmsg", Target: "config fd", Err: err}
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if rights, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	if len(fds) != ConfigFDs {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		return nil, nil, fmt.Errorf("reading config from fd %d: %d descriptors, want %d", ConfigFD, len(fds), ConfigFDs)
	}
	cfg, err := ParseConfig(buf[:n])
	if err != nil {
		return nil, nil, fmt.Errorf("reading config from fd %d: %w", ConfigFD, err)
	}
	return cfg, fds, nil
}

// ParseConfig decodes and checks a Config: one JSON object of at most
// maxConfig bytes, with no unknown fields.
func ParseConfig(b []byte) (*Config, error) {
	if len(b) == 0 {
		return nil, errors.New("config: empty (the host closed the config socket)")
	}
	if len(b) > maxConfig {
		return nil, fmt.Errorf("config: %d bytes, at most %d", len(b), maxConfig)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if dec.More() {
		return nil, errors.New("config: trailing data")
	}
	if len(cfg.Hostname) > 64 {
		return nil, fmt.Errorf("config: hostname of %d bytes, at most 64", len(cfg.Hostname))
	}
	return &cfg, nil
}

// listenerFD returns the descriptor number behind ln.
func listenerFD(ln net.Listener) (int, error) {
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		return -1, fmt.Errorf("listener is %T, not a unix listener", ln)
	}
	rc, err := ul.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1, err
	}
	return fd, nil
}

// closeExtraFDs closes every fd above 2 not in keep. Descriptors of the Go
// runtime itself (epoll, eventfd, pidfd: anonymous inodes) are left alone;
// they are close-on-exec and never reach a sandbox process.
func closeExtraFDs(keep map[int]bool) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || keep[fd] {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || strings.HasPrefix(target, "anon_inode:") {
			continue // the fd of ReadDir itself is gone by now, or runtime-owned
		}
		_ = unix.Close(fd)
	}
}

// execCgroup is the root of a private, detached cgroup2 mount whose root
// is the guest's delegated cgroup, made during setup; nil when there is
// none.
var execCgroup *os.File

// openExecCgroup mounts the cgroup v2 hierarchy as the guest's new cgroup
// namespace sees it (rooted at the delegated cgroup the guest was born
// in) without attaching the mount anywhere (fsopen, fsmount), and keeps
// the mount's root. Detached, the mount has no parent: ".." from its root
// stays there, so neither the guest nor a path through
// /proc/<pid>/fd/<n> can climb from it to anything but the delegated
// cgroup. It must run after unshare(CLONE_NEWCGROUP) and while the guest
// holds CAP_SYS_ADMIN; the descriptor is close-on-exec.
func openExecCgroup() error {
	fsfd, err := unix.Fsopen("cgroup2", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return &SyscallError{Op: "fsopen", Target: "cgroup2", Err: err}
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return &SyscallError{Op: "fsconfig", Target: "cgroup2", Err: err}
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return &SyscallError{Op: "fsmount", Target: "cgroup2", Err: err}
	}
	execCgroup = os.NewFile(uintptr(mfd), "exec-cgroup")
	return nil
}

// ExecCgroupDir returns the root of the guest's delegated cgroup (see
// openExecCgroup), or nil when the host delegated none. Call it from
// Main's serve function.
func ExecCgroupDir() *os.File { return execCgroup }
