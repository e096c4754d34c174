package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/native/forker"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

const (
	// setupTimeout bounds guest setup when ctx has no deadline.
	setupTimeout = 30 * time.Second
	// teardownTimeout bounds the teardown of a failed Create.
	teardownTimeout = 10 * time.Second
	guestLogName    = "guest.log"
	// guestPath and guestProcs are the only environment the guest starts
	// with. The guest serves on one P (see nsinit.setup); set here, the Go
	// runtime starts with one instead of changing to it with a
	// stop-the-world. Sandbox processes get an environment of their own.
	guestPath  = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	guestProcs = "GOMAXPROCS=1"
)

// Create starts the sandbox's guest and returns once it reported that setup
// succeeded (the socket then accepts connections). On error everything it
// made is removed again: processes, cgroup, socket, and the state dir's
// contents (the dir itself too, if Create made it).
func (b *Backend) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Sandbox, retErr error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	log := b.log.With("sandbox", spec.ID)
	start := time.Now()
	var undo cleanupStack
	defer undo.run()
	teardownCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
	}

	cgPath := b.cgroupPath(spec.ID)
	if _, err := loadCgroup(b.mode, cgPath); err == nil {
		return nil, fmt.Errorf("creating sandbox %s: cgroup %s exists: %w", spec.ID, cgPath, errdefs.ErrAlreadyExists)
	}
	if err := prepareStateDir(spec, &undo); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}

	// The guest: a prespawned one, already in a cgroup of its own that is
	// renamed to the sandbox's, or a new one.
	var (
		g  *guestProc
		cg cgroupManager
	)
	z := b.pool.take(spec)
	if z != nil {
		g = z.g
		undo.add(func() { _ = removeKeptLog(spec) })
		undo.add(func() { _ = os.Remove(spec.SocketPath) })
		undo.add(func() { _ = unix.Kill(g.pid, unix.SIGKILL) })
		var err error
		if cg, err = z.cg.renameTo(cgPath, spec.Resources); err != nil {
			z.cg.killAll(context.WithoutCancel(ctx))
			_ = z.cg.delete()
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
	} else {
		var err error
		if cg, err = newCgroup(b.mode, cgPath, spec.Resources); err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
		if err := b.delegateExecRoot(cg, cgPath, spec); err != nil {
			tctx, cancel := teardownCtx()
			_ = cg.killAll(tctx)
			cancel()
			_ = cg.delete()
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
	}
	undo.add(func() {
		tctx, cancel := teardownCtx()
		defer cancel()
		if err := cg.killAll(tctx); err != nil {
			log.Warn("teardown: killing cgroup", "err", err)
		}
		if err := cg.delete(); err != nil {
			log.Warn("teardown: deleting cgroup", "err", err)
		}
	})
	tCgroup := time.Since(start)
	if z == nil {
		lnFile, err := listen(spec.SocketPath)
		if err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
		undo.add(func() { _ = os.Remove(spec.SocketPath) })
		g, err = startGuest(b.forker, b.mode, spec, cg, lnFile)
		lnFile.Close()
		if err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
		if b.mode != "v2" { // on v2 the guest was born in its cgroup
			if err := cg.addProc(g.pid); err != nil {
				return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
			}
		}
	}
	undo.add(func() {
		_ = unix.Kill(g.pid, unix.SIGKILL)
		select {
		case <-g.done:
		case <-time.After(teardownTimeout):
			log.Warn("teardown: guest did not exit", "pid", g.pid)
		}
	})

	// Only now may the guest start setup: it blocks reading its config.
	tSpawn := time.Since(start)
	mounts, err := b.buildMounts(spec)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: building its root filesystem: %w", spec.ID, err)
	}
	err = g.sendConfig(spec, mounts, cg.execRoot() != "")
	mounts.close()
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: sending guest config: %w", spec.ID, err)
	}
	if err := g.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	st, err := procwatch.StartTime(g.pid)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: guest pid %d: %w", spec.ID, g.pid, err)
	}
	undo.release()
	log.InfoContext(ctx, "sandbox created", "pid", g.pid, "cgroup", cgPath, "took", time.Since(start),
		"cgroup_done", tCgroup, "guest_started", tSpawn, "prespawned", z != nil)
	return newSandbox(b, spec, cg, state{Pid: g.pid, StartTime: st, Cgroup: cgPath}, g.done), nil
}

// prepareStateDir creates spec.StateDir (0700: only the host side uses it;
// the guest never resolves a host path).
func prepareStateDir(spec runtime.Spec, undo *cleanupStack) error {
	if _, err := os.Stat(spec.StateDir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
		undo.add(func() { _ = os.RemoveAll(spec.StateDir) })
	} else if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.Chmod(spec.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	undo.add(func() { _ = os.Remove(filepath.Join(spec.StateDir, guestLogName)) })
	return nil
}

// listen creates the guest's listening socket at path (in a root-only
// directory) and returns it as a file to pass to the guest.
func listen(path string) (*os.File, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating socket dir: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode()&os.ModeSocket != 0:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	case err == nil:
		return nil, fmt.Errorf("socket path %s exists and is not a socket: %w", path, errdefs.ErrAlreadyExists)
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("socket path: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("socket permissions: %w", err)
	}
	f, err := ln.File()
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("socket file: %w", err)
	}
	return f, nil
}

// delegateExecRoot gives the guest of a new cold sandbox the v2 cgroup for
// its per-exec cgroups (execcgroup.go): on v2 the sandbox's cgroup, on a
// hybrid host a controller-less cgroup of the unified hierarchy beside the
// v1 ones (none on a legacy host).
func (b *Backend) delegateExecRoot(cg cgroupManager, cgPath string, spec runtime.Spec) error {
	switch c := cg.(type) {
	case *cgroupV2:
		return delegate(c.execRoot(), spec.UIDMap.HostID, spec.GIDMap.HostID)
	case *cgroupV1:
		if b.mode != "hybrid" {
			return nil
		}
		dir, err := newUnifiedDir(cgPath, spec.UIDMap.HostID, spec.GIDMap.HostID)
		if err != nil {
			return err
		}
		c.unified = dir
	}
	return nil
}

// guestProc is a started guest before it is ready.
type guestProc struct {
	pid   int
	cfgW  *os.File // config pipe, parent end
	syncR *os.File // sync pipe, parent end
	done  <-chan struct{}
}

// startGuest starts the runner binary cold in new namespaces with the
// protocol fds of package nsinit, directly inside the v2 cgroup delegated
// to it when there is one (cg.execRoot: the sandbox's cgroup on v2, its
// unified cgroup on a hybrid host).
func startGuest(f *guestForker, mode string, spec runtime.Spec, cg cgroupManager, lnFile *os.File) (*guestProc, error) {
	logFile, err := os.OpenFile(filepath.Join(spec.StateDir, guestLogName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("guest log: %w", err)
	}
	defer logFile.Close()
	cgfd := -1
	if dir := cg.execRoot(); dir != "" {
		cgfd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening cgroup dir: %w", err)
		}
		defer unix.Close(cgfd)
	}
	return spawnGuest(f, spec.RunnerDir, spec.UIDMap, spec.GIDMap, lnFile, logFile, cgfd, "")
}

// guestCloneflags are the namespaces a guest is started in.
const guestCloneflags = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUSER

// spawnGuest starts the runner's "agentbox guest init" in new user, mount,
// pid, uts, ipc, net and cgroup namespaces, as root of the new user
// namespace, through f (from this process when f is nil). lnFile becomes
// fd 3, the config socket fd 4, the sync pipe fd 5 and the runner binary
// fd 6 (the guest is executed through it: its uid cannot traverse the data
// dir, and it closes the descriptor first thing); stdout and stderr go to
// logFile. With cgfd >= 0 the guest is born in that cgroup (v2). A
// non-empty env is added to the guest's environment (a zygote's
// nsinit.EnvKeep). The guest blocks reading its config; its done channel
// closes when it exits.
func spawnGuest(f *guestForker, runnerDir string, uids, gids runtime.IDMap, lnFile, logFile *os.File, cgfd int, env string) (*guestProc, error) {
	cfgR, cfgW, err := configSocket()
	if err != nil {
		return nil, err
	}
	defer cfgR.Close()
	syncR, syncW, err := os.Pipe()
	if err != nil {
		cfgW.Close()
		return nil, err
	}
	defer syncW.Close()
	closeParent := func() { cfgW.Close(); syncR.Close() }

	devnull, err := os.Open(os.DevNull)
	if err != nil {
		closeParent()
		return nil, err
	}
	defer devnull.Close()

	path := filepath.Join(runnerDir, "agentbox")
	exe, err := os.Open(path)
	if err != nil {
		closeParent()
		return nil, fmt.Errorf("opening the guest binary: %w", err)
	}
	defer exe.Close()
	req := forker.Request{
		Path:                       "/proc/self/fd/6",
		Args:                       []string{"agentbox", "guest", "init"},
		Env:                        guestEnv(env),
		Dir:                        "/",
		Cloneflags:                 guestCloneflags,
		UIDMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uids.HostID), Size: int(uids.Size)}},
		GIDMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(gids.HostID), Size: int(gids.Size)}},
		GidMappingsEnableSetgroups: true,
		Setsid:                     true,
		// Become root of the new user namespace, so execve keeps the
		// namespace's full capability set for nsinit's setup.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		// No Pdeathsig: a sandbox survives its daemon's restart.
		CgroupFD: cgfd >= 0,
	}
	// fds 0-6, and the cgroup's last.
	files := []*os.File{devnull, logFile, logFile, lnFile, cfgR, syncW, exe}
	var (
		pid  int
		done <-chan struct{}
	)
	if f != nil {
		fds := make([]int, 0, len(files)+1)
		for _, file := range files {
			fds = append(fds, int(file.Fd()))
		}
		if cgfd >= 0 {
			fds = append(fds, cgfd)
		}
		var pidfd int
		if pid, pidfd, err = f.spawn(req, fds); err != nil {
			closeParent()
			return nil, fmt.Errorf("starting guest %s: %w", path, err)
		}
		if done, err = procwatch.Watch(pidfd); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			closeParent()
			return nil, fmt.Errorf("starting guest %s: %w", path, err)
		}
	} else {
		cmd := &exec.Cmd{
			Path:        req.Path,
			Args:        req.Args,
			Env:         req.Env,
			Dir:         req.Dir,
			Stdin:       devnull,
			Stdout:      logFile,
			Stderr:      logFile,
			ExtraFiles:  files[3:],
			SysProcAttr: req.SysProcAttr(cgfd),
		}
		if err := cmd.Start(); err != nil {
			closeParent()
			return nil, fmt.Errorf("starting guest %s: %w", cmd.Path, err)
		}
		pid = cmd.Process.Pid
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		done = exited
	}
	return &guestProc{pid: pid, cfgW: cfgW, syncR: syncR, done: done}, nil
}

// guestEnv is the guest's environment: PATH, GOMAXPROCS and extra, when
// not empty.
func guestEnv(extra string) []string {
	if extra == "" {
		return []string{guestPath, guestProcs}
	}
	return []string{guestPath, guestProcs, extra}
}

// configSocket returns the two ends of a guest's config socket (a
// SOCK_SEQPACKET pair: one message, the config with its mounts).
func configSocket() (child, parent *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("config socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "config"), os.NewFile(uintptr(fds[1]), "config"), nil
}

// sendConfig sends spec's config with its mounts (see nsinit) and closes
// the config socket.
func (g *guestProc) sendConfig(spec runtime.Spec, m guestMounts, execCgroups bool) error {
	defer g.cfgW.Close()
	b, err := json.Marshal(nsinit.Config{
		ExecCgroups: execCgroups,
		Hostname:    spec.Hostname,
		OpenFiles:   uint64(max(spec.Resources.OpenFiles, 0)),
	})
	if err != nil {
		return err
	}
	return unix.Sendmsg(int(g.cfgW.Fd()), b, unix.UnixRights(m[nsinit.RootfsIndex], m[nsinit.RunnerIndex]), nil, 0)
}

// waitReady waits for the guest's setup report, bounded by ctx (or
// setupTimeout without a deadline).
func (g *guestProc) waitReady(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	res := make(chan error, 1)
	go func() { res <- nsinit.ReadSync(g.syncR) }()
	defer g.syncR.Close()
	select {
	case err := <-res:
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrInternal)
		}
		return nil
	case <-ctx.Done():
		_ = g.syncR.SetReadDeadline(time.Now())
		return fmt.Errorf("waiting for guest setup: %w", errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
	}
}
