package gvinit

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// fromHost reports whether c, a connection accepted on one of the guest's
// sockets, was made from the host. Both sockets are bound through the
// gofer (--host-uds=create), so a connection reaches the guest one of
// two ways: from the host, through the host socket (the sentry makes it
// an external endpoint, which carries no peer credentials: SO_PEERCRED
// reads pid 0, uid and gid -1, as Linux for a peer without them), or from
// a process of the sandbox that found the socket's name in the sentry's
// file system while it was there (an internal connection: the sentry
// records the connecting task's credentials, whose uid is always a valid
// one, and whose pid, while the task lives, is not 0). Only the host may
// talk to the guest: a sandbox process connected to the guest's new
// socket in the window after a memory checkpoint must not get a
// challenge it could relay to the host from a socket of its own
// (auth.go). Anything that is not a unix connection, or whose
// credentials cannot be read, counts as not the host's.
func fromHost(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || gerr != nil {
		return false
	}
	return noPeer(cred)
}

// noPeer reports whether cred are the credentials of a peer without any
// (see fromHost).
func noPeer(cred *unix.Ucred) bool {
	const noID = ^uint32(0)
	return cred.Pid == 0 && cred.Uid == noID && cred.Gid == noID
}
