package nsinit

import "golang.org/x/sys/unix"

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
