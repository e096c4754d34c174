package guest

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
	"github.com/agentbox/agentbox/internal/validate"
)

// DefaultPath is the PATH of every process unless the request sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// signalName is "KILL" for SIGKILL.
func signalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(s))
}

// parseSignal accepts "TERM", "SIGTERM", "term" or "15".
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %d out of range: %w", n, errdefs.ErrInvalidArgument)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, fmt.Errorf("unknown signal %q: %w", s, errdefs.ErrInvalidArgument)
	}
	return sig, nil
}

// execSpec is a validated, resolved exec request.
type execSpec struct {
	path string
	argv []string
	env  []string
	dir  string // started in through a descriptor: see openCwd
	cred *syscall.Credential
}

// openCwd opens the working directory of a process to start, refusing
// magic links (/proc/<pid>/fd/<n>, /proc/<pid>/cwd, root), whether in a
// requested cwd or planted as a symlink at a home directory: the child
// changes into it before its execve, while it still holds the guest's
// close-on-exec descriptors (the exec cgroup tree among them), which must
// not be reachable that way. The process is then started in
// "/proc/self/fd/<fd>", the directory this check saw, so no symlink
// swapped in after the check matters.
func openCwd(dir string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("cwd %q: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	return fd, nil
}

func (s *server) resolveExec(req *api.ExecRequest) (*execSpec, error) {
	var argv []string
	switch {
	case len(req.Cmd) > 0 && req.Command != "":
		return nil, fmt.Errorf("both cmd and command set: %w", errdefs.ErrInvalidArgument)
	case len(req.Cmd) > 0:
		argv = req.Cmd
	case req.Command != "":
		argv = []string{"/bin/sh", "-c", req.Command}
	default:
		return nil, fmt.Errorf("one of cmd or command is required: %w", errdefs.ErrInvalidArgument)
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("argument contains a NUL byte: %w", errdefs.ErrInvalidArgument)
		}
	}
	if req.TimeoutSeconds < 0 {
		return nil, fmt.Errorf("negative timeout: %w", errdefs.ErrInvalidArgument)
	}
	acct, err := lookupAccount(s.etc, req.User)
	if err != nil {
		return nil, err
	}
	env := map[string]string{"PATH": DefaultPath, "HOME": acct.home}
	if acct.name != "" {
		env["USER"], env["LOGNAME"] = acct.name, acct.name
	}
	if h, err := os.Hostname(); err == nil {
		env["HOSTNAME"] = h
	}
	if req.TTY != nil {
		env["TERM"] = "xterm"
	}
	maps.Copy(env, s.opts.Env)
	if err := validate.Environ(req.Env); err != nil {
		return nil, err
	}
	maps.Copy(env, req.Env)
	spec := &execSpec{argv: argv}
	for k, v := range env {
		spec.env = append(spec.env, k+"="+v)
	}

	spec.dir = req.Cwd
	if spec.dir == "" {
		spec.dir = "/"
		if fi, err := os.Stat(acct.home); err == nil && fi.IsDir() {
			spec.dir = acct.home
		}
	} else {
		if err := checkPath(spec.dir); err != nil {
			return nil, fmt.Errorf("cwd: %w", err)
		}
		fi, err := os.Stat(spec.dir)
		if err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("cwd %q is not an existing directory: %w", spec.dir, errdefs.ErrInvalidArgument)
		}
	}
	if spec.path, err = lookPath(argv[0], env["PATH"], spec.dir); err != nil {
		return nil, err
	}
	if req.User != "" {
		spec.cred = &syscall.Credential{Uid: acct.uid, Gid: acct.gid, Groups: acct.groups}
	}
	return spec, nil
}

// lookPath finds file like a shell does, in the process's PATH and cwd.
func lookPath(file, pathEnv, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := isExecutable(p); err != nil {
			reason := errdefs.ReasonCommandNotExecutable
			if errors.Is(err, fs.ErrNotExist) {
				reason = errdefs.ReasonCommandNotFound
			}
			return "", errdefs.WithReason(fmt.Errorf("executable %q: %w", file, err), reason)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, file)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", errdefs.WithReason(fmt.Errorf("executable %q not found in PATH: %w", file, errdefs.ErrNotFound), errdefs.ReasonCommandNotFound)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file: %w", p, errdefs.ErrPermissionDenied)
	}
	return nil
}

// start starts a process for req. sub, when not nil, is subscribed before
// any output is produced.
func (s *server) start(req *api.ExecRequest, sub *subscriber) (*process, error) {
	if req.Private {
		// Its secrets are in the guest's memory from now on, whatever
		// becomes of the process (ActivityReply.PrivateExecs).
		s.table.privateExecs.Add(1)
	}
	spec, err := s.resolveExec(req)
	if err != nil {
		return nil, err
	}
	p := &process{
		cmd:     spec.argv,
		private: req.Private,
		tty:     req.TTY != nil,
		reaped:  make(chan struct{}),
		done:    make(chan struct{}),
		subs:    make(map[*subscriber]struct{}),
		ring:    outputRing{max: s.opts.MaxOutputBuffer},
	}
	if sub != nil {
		p.subs[sub] = struct{}{}
	}

	// parentEnds are read by the pumps; childEnds are closed after the fork.
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	var outputs []*os.File
	var streams []proto.FrameType
	cwd, err := openCwd(spec.dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(cwd)
	attr := &syscall.ProcAttr{
		Dir: "/proc/self/fd/" + strconv.Itoa(cwd),
		Env: spec.env,
		Sys: &syscall.SysProcAttr{Setsid: true, Credential: spec.cred},
	}
	if req.TTY != nil {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("opening a PTY: %w", err)
		}
		childEnds = append(childEnds, slave)
		if req.TTY.Rows != 0 || req.TTY.Cols != 0 {
			if err := setWinsize(master, *req.TTY); err != nil {
				master.Close()
				return nil, err
			}
		}
		fd := slave.Fd()
		attr.Files = []uintptr{fd, fd, fd}
		attr.Sys.Setctty, attr.Sys.Ctty = true, 0
		p.stdin, p.pty = master, master
		outputs, streams = []*os.File{master}, []proto.FrameType{proto.FrameStdout}
	} else {
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("creating stdin pipe: %w", err)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			stdinR.Close()
			stdinW.Close()
			return nil, fmt.Errorf("creating stdout pipe: %w", err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			for _, f := range []*os.File{stdinR, stdinW, outR, outW} {
				f.Close()
			}
			return nil, fmt.Errorf("creating stderr pipe: %w", err)
		}
		childEnds = append(childEnds, stdinR, outW, errW)
		attr.Files = []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()}
		p.stdin = stdinW
		outputs, streams = []*os.File{outR, errR}, []proto.FrameType{proto.FrameStdout, proto.FrameStderr}
	}

	pid, err := s.startIn(p, spec, attr, req.Private)
	if err != nil {
		for _, f := range outputs {
			f.Close()
		}
		if p.stdin != p.pty {
			p.stdin.Close()
		}
		return nil, fmt.Errorf("starting %q: %w", spec.argv[0], err)
	}
	p.pid = pid
	p.startedAt = time.Now()
	s.table.add(p)
	p.outputs = outputs
	for i, f := range outputs {
		p.pumps.Add(1)
		go p.pump(f, streams[i])
	}
	if req.TimeoutSeconds > 0 {
		p.timer = time.AfterFunc(time.Duration(req.TimeoutSeconds*float64(time.Second)), func() {
			p.timedOut.Store(true)
			_ = p.signal(syscall.SIGKILL) // the whole exec: see process.signal
		})
	}
	go p.finish(s.table, s.cgs)

	// Stdin data is written, then stdin closed unless StdinOpen. A TTY
	// without input is left alone (as with "docker exec -t" without -i).
	if len(req.Stdin) > 0 || (!req.StdinOpen && !p.tty) {
		data, keepOpen := req.Stdin, req.StdinOpen
		go func() {
			if len(data) > 0 {
				_ = p.writeStdin(data)
			}
			if !keepOpen {
				p.closeStdin(true)
			}
		}()
	}
	s.log.Debug("process started", "pid", pid, "cmd", spec.argv[0], "tty", p.tty)
	return p, nil
}

// startIn forks the exec's process through the reaper, inside a cgroup of
// its own when the guest has them (execCgroups), and records the cgroup in
// p. Should the start fail inside a cgroup but succeed without one, the
// cgroup was at fault and per-exec cgroups are turned off; a start that
// fails either way (an execve error) is reported as such.
func (s *server) startIn(p *process, spec *execSpec, attr *syscall.ProcAttr, private bool) (int, error) {
	start := func() (int, error) {
		return s.reaper.start(func() (int, error) {
			return s.dom.fork(private, func() (int, error) { return syscall.ForkExec(spec.path, spec.argv, attr) })
		}, p.onExit)
	}
	name, fd := s.cgs.create()
	if fd < 0 {
		return start()
	}
	attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = true, fd
	pid, err := start()
	unix.Close(fd)
	attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
	if err == nil {
		p.cgroup, p.cgs = name, s.cgs
		return pid, nil
	}
	s.cgs.remove(name)
	if errors.Is(err, errNoDomain) {
		return 0, err
	}
	pid, err2 := start()
	if err2 == nil {
		s.cgs.disable("starting a process in its exec cgroup", err)
	}
	return pid, err2
}
