package forker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// ConnFD is the helper's end of the socket pair.
const ConnFD = 3

// Main serves requests on ConnFD until the caller closes its end, then
// exits 0 (1 if the socket is unusable). It must be the helper's only
// work: it reaps every child of the process.
func Main() {
	f := os.NewFile(ConnFD, "forker")
	c, err := net.FileConn(f)
	f.Close()
	uc, ok := c.(*net.UnixConn)
	if err != nil || !ok {
		fmt.Fprintf(os.Stderr, "agentbox forker: fd %d is not a unix socket: %v\n", ConnFD, err)
		os.Exit(1)
	}
	reap()
	if err := serve(uc); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox forker: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// reap collects the status of every exited child from now on, so that none
// stays a zombie: the caller watches its children through their pidfds.
func reap() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGCHLD)
	go func() {
		for range ch {
			for {
				var ws unix.WaitStatus
				pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
				if err == unix.EINTR {
					continue
				}
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}()
}

// serve answers requests one at a time until EOF.
func serve(c *net.UnixConn) error {
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(4*maxFiles))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading a request: %w", err)
		}
		fds, err := receivedFDs(oob[:oobn])
		var r reply
		pidfd := -1
		if err == nil {
			r.Pid, pidfd, err = startChild(buf[:n], fds)
		}
		closeAll(fds)
		if err != nil {
			msg := err.Error()
			if len(msg) > maxReply/8 { // JSON-escaped, it still fits
				msg = msg[:maxReply/8]
			}
			r = reply{Error: msg}
		}
		b, _ := json.Marshal(r)
		var rights []byte
		if pidfd >= 0 {
			rights = unix.UnixRights(pidfd)
		}
		_, _, werr := c.WriteMsgUnix(b, rights, nil)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if werr != nil {
			return fmt.Errorf("writing a reply: %w", werr)
		}
	}
}

// startChild starts the process of request b with fds and returns its pid and
// pidfd.
func startChild(b []byte, fds []int) (int, int, error) {
	var req Request
	if err := json.Unmarshal(b, &req); err != nil {
		return 0, -1, fmt.Errorf("request: %w", err)
	}
	cgroupFD := -1
	if req.CgroupFD {
		if len(fds) == 0 {
			return 0, -1, fmt.Errorf("request: no cgroup descriptor")
		}
		cgroupFD, fds = fds[len(fds)-1], fds[:len(fds)-1]
	}
	pidfd := -1
	attr := req.SysProcAttr(cgroupFD)
	attr.PidFD = &pidfd
	files := make([]uintptr, len(fds))
	for i, fd := range fds {
		files[i] = uintptr(fd)
	}
	pid, err := syscall.ForkExec(req.Path, req.Args, &syscall.ProcAttr{Dir: req.Dir, Env: req.Env, Files: files, Sys: attr})
	if err != nil {
		return 0, -1, err
	}
	return pid, pidfd, nil
}
