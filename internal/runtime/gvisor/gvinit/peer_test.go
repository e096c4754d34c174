package gvinit

import (
	"net"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoPeer: only the credentials the sentry gives a connection from the
// host (none: pid 0, uid and gid -1) count as the host's; a task's never
// do, not even root's or one that has exited (pid 0, but a valid uid).
func TestNoPeer(t *testing.T) {
	for _, c := range []struct {
		cred unix.Ucred
		want bool
	}{
		{unix.Ucred{Pid: 0, Uid: ^uint32(0), Gid: ^uint32(0)}, true},
		{unix.Ucred{Pid: 0, Uid: 0, Gid: 0}, false},
		{unix.Ucred{Pid: 7, Uid: ^uint32(0), Gid: ^uint32(0)}, false},
		{unix.Ucred{Pid: 0, Uid: ^uint32(0), Gid: 0}, false},
		{unix.Ucred{Pid: 1, Uid: 0, Gid: 0}, false},
	} {
		if got := noPeer(&c.cred); got != c.want {
			t.Errorf("noPeer(%+v) = %v, want %v", c.cred, got, c.want)
		}
	}
}

// TestFromHostRefusesProcesses: outside the sentry every unix connection
// has a peer with credentials, so none counts as the host's; nor does a
// connection that is not a unix socket.
func TestFromHostRefusesProcesses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("unix", p)
		if err == nil {
			defer c.Close()
			b := make([]byte, 1)
			_, _ = c.Read(b)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if fromHost(c) {
		t.Error("a connection from a process counts as the host's")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if fromHost(a) {
		t.Error("a pipe counts as the host's")
	}
}
