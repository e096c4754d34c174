package nsinit

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// loopbackUp brings up lo, the only interface of the sandbox's network
// namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return &SyscallError{Op: "socket", Target: "lo", Err: err}
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return &SyscallError{Op: "ifreq", Target: "lo", Err: err}
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return &SyscallError{Op: "ioctl SIOCGIFFLAGS", Target: "lo", Err: err}
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return &SyscallError{Op: "ioctl SIOCSIFFLAGS", Target: "lo", Err: err}
	}
	return nil
}

// pingGroupRange is the sysctl that lets processes whose group is in range
// open datagram ICMP sockets (ping without CAP_NET_RAW).
const pingGroupRange = "/proc/sys/net/ipv4/ping_group_range"

// allowPing opens net.ipv4.ping_group_range of the sandbox's network
// namespace (the calling thread's) to every gid mapped into the sandbox, so
// ping works without CAP_NET_RAW. It must run while the guest still holds
// CAP_NET_ADMIN. The kernel reads the range in the writer's user
// namespace, so it must not go beyond the gid map.
func allowPing() error {
	hi, err := highestMappedID("/proc/self/gid_map")
	if err != nil {
		return &SyscallError{Op: "read", Target: "gid_map", Err: err}
	}
	if err := os.WriteFile(pingGroupRange, []byte("0 "+strconv.FormatUint(hi, 10)), 0); err != nil {
		return &SyscallError{Op: "write", Target: pingGroupRange, Err: err}
	}
	return nil
}

// highestMappedID returns the highest id of the caller's user namespace
// mapped by an id map file (uid_map or gid_map).
func highestMappedID(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseHighestMappedID(f)
}

// parseHighestMappedID reads an id map ("inside outside count" lines) and
// returns the highest inside id it maps; lines that are not three 32-bit
// numbers with a count above 0 are skipped. It fails with EINVAL when no
// line maps anything.
func parseHighestMappedID(r io.Reader) (uint64, error) {
	var hi uint64
	found := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue
		}
		in, err1 := strconv.ParseUint(fs[0], 10, 32)
		n, err2 := strconv.ParseUint(fs[2], 10, 32)
		if err1 != nil || err2 != nil || n == 0 {
			continue
		}
		if top := in + n - 1; !found || top > hi {
			hi, found = top, true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, unix.EINVAL
	}
	return hi, nil
}

// namespaceLimits are the per-user-namespace limits on nested namespaces.
var namespaceLimits = []string{
	"max_user_namespaces", "max_mnt_namespaces", "max_pid_namespaces", "max_net_namespaces",
	"max_ipc_namespaces", "max_uts_namespaces", "max_cgroup_namespaces", "max_time_namespaces",
}

// forbidNamespaces sets every user.max_*_namespaces of the sandbox's user
// namespace to 0: no process of the sandbox can create a namespace, even
// a user namespace (which needs no capability) through clone3, which the
// seccomp filter cannot inspect (see Policy). The limits bind the whole
// subtree and only CAP_SYS_RESOURCE in the sandbox's user namespace could
// raise them; it must run before applySecurity drops that, and through a
// writable /proc/sys (before the pivot).
func forbidNamespaces() error {
	for _, n := range namespaceLimits {
		p := "/proc/sys/user/" + n
		if err := os.WriteFile(p, []byte("0"), 0); err != nil {
			if os.IsNotExist(err) && n == "max_time_namespaces" {
				continue // before Linux 5.6
			}
			return &SyscallError{Op: "write", Target: p, Err: err}
		}
	}
	return nil
}
