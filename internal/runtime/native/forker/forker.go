// Package forker starts processes from a small helper process instead of
// from the caller. The native backend starts every guest through it.
//
// Go forks without CLONE_VM when the child gets a new user namespace (the
// child must wait for its uid map), so starting a guest from the daemon
// copied the daemon's page tables, and every page the daemon wrote
// afterwards took a fault: with a dozen creates a second that was a sixth
// of the host's CPU. The helper is a fresh, mostly idle Go process: its
// page tables are a fraction of the daemon's and it writes little between
// forks. It also reaps the children, so the caller keeps no thread blocked
// in wait per child; it watches a child's pidfd instead.
//
// The helper is the binary the caller names, run so that it calls Main
// (cmd/agentbox: "agentbox guest fork"). The two talk over a SOCK_SEQPACKET
// socket pair, one request and one reply at a time: a JSON Request with the
// child's descriptors (SCM_RIGHTS), and a JSON reply with the child's
// pidfd. The helper exits when the caller closes its end (or dies); the
// children it started live on.
package forker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Request is a process to start: syscall.ForkExec's argv, environment,
// working directory and the subset of syscall.SysProcAttr the native
// backend's guests use. The descriptors travel beside it: the child's fds
// 0, 1, 2, 3, ... in order, then, with CgroupFD, the cgroup directory it is
// born in (CLONE_INTO_CGROUP).
type Request struct {
	Path                       string                 `json:"path"`
	Args                       []string               `json:"args"`
	Env                        []string               `json:"env"`
	Dir                        string                 `json:"dir"`
	Cloneflags                 uintptr                `json:"cloneflags"`
	UIDMappings                []syscall.SysProcIDMap `json:"uid_mappings,omitempty"`
	GIDMappings                []syscall.SysProcIDMap `json:"gid_mappings,omitempty"`
	GidMappingsEnableSetgroups bool                   `json:"gid_mappings_enable_setgroups,omitempty"`
	Setsid                     bool                   `json:"setsid,omitempty"`
	Credential                 *syscall.Credential    `json:"credential,omitempty"`
	CgroupFD                   bool                   `json:"cgroup_fd,omitempty"`
	// Ptrace makes the child stop (SIGTRAP, traced by the helper) right
	// after its execve, before any of the program runs: a child that only
	// has to hold its namespaces until the caller kills it starts for the
	// price of the exec alone.
	Ptrace bool `json:"ptrace,omitempty"`
}

// SysProcAttr is r's process attributes; with r.CgroupFD the process is
// born in the cgroup of directory descriptor cgroupFD.
func (r Request) SysProcAttr(cgroupFD int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:                 r.Cloneflags,
		UidMappings:                r.UIDMappings,
		GidMappings:                r.GIDMappings,
		GidMappingsEnableSetgroups: r.GidMappingsEnableSetgroups,
		Setsid:                     r.Setsid,
		Credential:                 r.Credential,
		UseCgroupFD:                r.CgroupFD,
		CgroupFD:                   cgroupFD,
		Ptrace:                     r.Ptrace,
	}
}

// reply is the helper's answer: the child's pid (with its pidfd attached)
// or why it could not be started.
type reply struct {
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// maxFiles bounds the descriptors of one request.
const maxFiles = 16

// maxMessage bounds a request, maxReply a reply (a pid, or an error
// message).
const (
	maxMessage = 64 << 10
	maxReply   = 4 << 10
)

// Client is the caller's end of a helper. Safe for concurrent use; requests
// are served one at a time.
type Client struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the helper is reaped

	// mu guards the fields below and serialises requests.
	mu     sync.Mutex
	conn   *net.UnixConn
	closed bool
}

// Start starts the helper: path with args, which must make it call Main.
// The helper inherits nothing but its end of the socket pair (fd 3) and
// stderr.
func Start(path string, args ...string) (*Client, error) { return start(path, args, nil) }

// start is Start with env added to the helper's environment.
func start(path string, args, env []string) (*Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("forker socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "forker"), os.NewFile(uintptr(fds[1]), "forker")
	defer theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("forker socket: %w", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append([]string{"GOMAXPROCS=1"}, env...) // it forks one child at a time
	cmd.Dir = "/"
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("starting forker %s: %w", path, err)
	}
	c := &Client{cmd: cmd, exited: make(chan struct{}), conn: conn.(*net.UnixConn)}
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// ErrClosed is returned by Spawn on a closed client, or one whose helper
// has exited; start a new one.
var ErrClosed = errors.New("forker closed")

// Spawn starts req's process with fds as its descriptors (see Request)
// and returns its pid and a pidfd for it (non-blocking, close-on-exec; the
// caller owns it). The helper reaps the process when it exits; watch the
// pidfd to learn when. fds stay open on the caller's side.
func (c *Client) Spawn(req Request, fds []int) (pid, pidfd int, err error) {
	if len(fds) > maxFiles {
		return 0, -1, fmt.Errorf("forker: %d descriptors, at most %d", len(fds), maxFiles)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return 0, -1, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, -1, ErrClosed
	}
	if _, _, err := c.conn.WriteMsgUnix(b, unix.UnixRights(fds...), nil); err != nil {
		c.closeLocked()
		return 0, -1, fmt.Errorf("forker request: %w: %w", ErrClosed, err)
	}
	buf := make([]byte, maxReply)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.conn.ReadMsgUnix(buf, oob)
	if err == nil && n == 0 {
		err = errors.New("forker exited")
	}
	if err != nil {
		c.closeLocked()
		return 0, -1, fmt.Errorf("forker reply: %w: %w", ErrClosed, err)
	}
	got, err := receivedFDs(oob[:oobn])
	if err != nil {
		return 0, -1, err
	}
	var r reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		closeAll(got)
		return 0, -1, fmt.Errorf("forker reply: %w", err)
	}
	if r.Error != "" {
		closeAll(got)
		return 0, -1, fmt.Errorf("starting %s: %s", req.Path, r.Error)
	}
	if len(got) != 1 || r.Pid <= 0 {
		closeAll(got)
		return 0, -1, fmt.Errorf("forker reply: pid %d with %d descriptors", r.Pid, len(got))
	}
	if err := unix.SetNonblock(got[0], true); err != nil {
		closeAll(got)
		return 0, -1, fmt.Errorf("pidfd: %w", err)
	}
	return r.Pid, got[0], nil
}

// Close closes the caller's end; the helper exits once it sees that. The
// processes it started live on.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
	return nil
}

func (c *Client) closeLocked() {
	if !c.closed {
		c.closed = true
		c.conn.Close()
	}
}

// receivedFDs returns the descriptors of SCM_RIGHTS messages in oob.
func receivedFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("forker: control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		rights, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, rights...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
