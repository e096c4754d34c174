package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/cleanup"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
	"github.com/agentbox/agentbox/internal/runtime/procwatch"
)

const (
	// setupTimeout bounds a Create whose ctx has no deadline.
	setupTimeout = 30 * time.Second
	// teardownTimeout bounds the teardown of a failed Create and Destroy's
	// wait for the sandbox process.
	teardownTimeout = 15 * time.Second
	guestLogName    = "guest.log"
)

// Create starts the sandbox: its bundle (bundle.go), then `runsc run
// --detach`, then waits until the guest answers on the socket it bound in
// the bundle's socket directory. That socket is then renamed to
// spec.SocketPath (a rename keeps a bound unix socket reachable: connect
// resolves the path to the same inode), and the directory given back to
// host root, 0555: the sandbox, whose root is an unprivileged host uid in
// the gofer, can create nothing there any more. Only the guest has run by
// then, so the socket moved is the guest's own. On error everything Create
// made is removed: the runsc container, the mounts, the bundle, the
// socket, and the state dir if Create made it.
func (b *Backend) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	return b.create(ctx, spec, "")
}

// create is Create, or RestoreMemory when image is not "" (runsc restore
// from that image instead of runsc run).
func (b *Backend) create(ctx context.Context, spec runtime.Spec, image string) (_ runtime.Sandbox, retErr error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	var nonce string
	if image != "" {
		var err error
		if nonce, err = readNonce(image); err != nil {
			return nil, fmt.Errorf("restoring sandbox %s: %w", spec.ID, err)
		}
	}
	start := time.Now()
	log := b.log.With("sandbox", spec.ID)
	teardown := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
	}
	var undo cleanup.Stack
	defer undo.Clean()

	bdir := b.bundleDir(spec.ID)
	if err := os.Mkdir(bdir, 0o711); errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating sandbox %s: it exists on the gvisor backend: %w", spec.ID, errdefs.ErrAlreadyExists)
	} else if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: bundle: %w", spec.ID, err)
	}
	undo.Add(func() {
		if err := unmountBundle(bdir); err != nil {
			log.Warn("teardown: removing bundle", "err", err)
		}
	})
	if err := prepareStateDir(spec, &undo); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	if fi, err := os.Stat(filepath.Join(spec.RunnerDir, "agentbox")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("creating sandbox %s: no guest binary in runner dir %s: %w", spec.ID, spec.RunnerDir, errdefs.ErrFailedPrecondition)
	}
	if err := mountRootfs(spec, bdir); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: root filesystem: %w", spec.ID, err)
	}
	ids := layerIDs(spec)
	udir := filepath.Join(bdir, bundleSocket)
	if err := os.Mkdir(udir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	if err := os.Chown(udir, int(ids.HostID), int(ids.HostID)); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	if image != "" {
		if err := placeholders(udir); err != nil {
			return nil, fmt.Errorf("restoring sandbox %s: %w", spec.ID, err)
		}
	}
	if err := writeSpec(bdir, ociSpec(spec, bdir, b.cgroupPath(spec.ID))); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: writing its OCI spec: %w", spec.ID, err)
	}
	if err := prepareSocketPath(spec.SocketPath); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}

	// From here on the container may exist: it is deleted on error.
	undo.Add(func() {
		tctx, cancel := teardown()
		defer cancel()
		if err := b.deleteContainer(tctx, spec.ID); err != nil {
			log.Warn("teardown: deleting runsc container", "err", err)
		}
	})
	tBundle := time.Since(start)
	pid, err := b.run(ctx, spec, bdir, image)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: sandbox pid %d: %w", spec.ID, pid, err)
	}
	startTime, err := procwatch.StartTime(pid)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("creating sandbox %s: sandbox pid %d: %w", spec.ID, pid, err)
	}
	done, err := procwatch.Watch(pidfd)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
	}
	tRun := time.Since(start) - tBundle
	sock := filepath.Join(udir, gvinit.SocketName)
	if image != "" {
		// The sandbox's own processes run already: its sockets are proved.
		if err := claimVerified(ctx, udir, spec.SocketPath, nonce, ids.HostID, done); err != nil {
			return nil, fmt.Errorf("restoring sandbox %s: %w%s", spec.ID, err, logTail(spec))
		}
	} else {
		if err := waitGuest(ctx, sock, done); err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w%s", spec.ID, err, logTail(spec))
		}
		if err := claimSocket(sock, spec.SocketPath, udir); err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", spec.ID, err)
		}
	}
	undo.Add(func() { _ = os.Remove(spec.SocketPath) })
	tGuest := time.Since(start) - tBundle - tRun
	st := state{Pid: pid, StartTime: startTime, ContainerID: spec.ID, Root: b.root, Bundle: bdir, Cgroup: b.cgroupPath(spec.ID), Nonce: nonce}
	undo.Release()
	// The parts of a create (docs/BENCHMARKS-gvisor.md): the bundle and
	// its mounts, runsc run (or restore) --detach, and the wait for the
	// guest to answer and the claim of its sockets.
	log.InfoContext(ctx, "sandbox created", "pid", pid, "took", time.Since(start), "bundle", tBundle, "runsc_run", tRun, "guest", tGuest)
	return b.newSandbox(spec, st, done), nil
}

// prepareStateDir creates spec.StateDir (0700) unless it exists; the undo
// removes it again only if Create made it.
func prepareStateDir(spec runtime.Spec, undo *cleanup.Stack) error {
	if _, err := os.Stat(spec.StateDir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
		undo.Add(func() { _ = os.RemoveAll(spec.StateDir) })
	} else if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	undo.Add(func() { _ = os.Remove(filepath.Join(spec.StateDir, guestLogName)) })
	return os.Chmod(spec.StateDir, 0o700)
}

// prepareSocketPath makes the socket's directory (0700) and removes a
// stale socket at path; anything else there is ErrAlreadyExists.
func prepareSocketPath(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode()&os.ModeSocket != 0:
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("removing stale socket: %w", err)
		}
	case err == nil:
		return fmt.Errorf("socket path %s exists and is not a socket: %w", path, errdefs.ErrAlreadyExists)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("socket path: %w", err)
	}
	return nil
}

// run starts the container detached and returns the sandbox process's pid
// (the sentry's, which exits when the guest does). The guest's stdout and
// stderr, and runsc's own messages, go to the guest log. runsc is killed
// when ctx ends first (its error is then ctx's); the caller's teardown
// deletes whatever it had made.
func (b *Backend) run(ctx context.Context, spec runtime.Spec, bdir, image string) (int, error) {
	logFile, err := os.OpenFile(filepath.Join(spec.StateDir, guestLogName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("guest log: %w", err)
	}
	defer logFile.Close()
	pidFile := filepath.Join(bdir, "pid")
	verb := []string{"run"}
	if image != "" {
		verb = []string{"restore", "--image-path=" + image}
	}
	args := append(append(b.globalFlags(), verb...), "--detach", "--bundle="+bdir, "--pid-file="+pidFile, spec.ID)
	cmd := exec.CommandContext(ctx, b.runscPath, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = bdir
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("runsc run: %w", errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
		}
		return 0, fmt.Errorf("runsc %s: %w%s", verb[0], err, logTail(spec))
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("runsc run: pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("runsc run: pid file holds %q", raw)
	}
	return pid, nil
}

// guestPollMax is the longest pause between two of waitGuest's dials.
// Polling faster (2 ms at most, from 250 µs) would take about 5 ms off a
// create's median (of ≈0.4 s). It was tried and left out: with it,
// TestMemoryCheckpointRestore failed 5 runs in 7 on a loaded machine;
// without it 3 in 9, and on the commit before this change 2 in 10 (the
// sandbox exits during the checkpoint's reconnect, or a restore times
// out): the memory checkpoint path had a race of its own, which the
// faster poll seemed to make likelier. All of this was before main's
// claim of a rebound socket waited for it to answer (the gvfork branch),
// which fixed restores that never came back: the faster poll is worth
// trying again on top of it.
const guestPollMax = 20 * time.Millisecond

// waitGuest waits until the guest accepts connections on sock, the
// sandbox process exits (done) or ctx ends.
func waitGuest(ctx context.Context, sock string, done <-chan struct{}) error {
	delay := time.Millisecond
	for {
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("the sandbox exited before its guest listened: %w", errdefs.ErrInternal)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest: %w", errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
		case <-time.After(delay):
		}
		delay = min(2*delay, guestPollMax)
	}
}

// claimSocket moves the guest's socket sock to path, and its control
// socket (gvinit.CtlName, bound right after sock) to ctlPath beside the
// bundle, and closes their directory udir to the sandbox (host root's,
// 0555).
func claimSocket(sock, path, udir string) error {
	ctl := filepath.Join(udir, gvinit.CtlName)
	for i := 0; ; i++ {
		fi, err := os.Lstat(ctl)
		if err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if i >= 2000 {
			return fmt.Errorf("the guest bound no control socket: %w", errdefs.ErrInternal)
		}
		time.Sleep(time.Millisecond)
	}
	if err := moveSocket(ctl, filepath.Join(filepath.Dir(udir), ctlSocket)); err != nil {
		return fmt.Errorf("moving the guest's control socket into place: %w", err)
	}
	if err := moveSocket(sock, path); err != nil {
		return fmt.Errorf("moving the guest socket into place: %w", err)
	}
	return closeDir(udir)
}

// moveSocket renames the socket from (in the socket directory, which the
// sandbox may be able to write to) to to (in a directory of host root's)
// and makes it host root's, 0600. What arrives at to is checked there,
// where nothing of the sandbox can change it any more: anything but a
// socket (a symlink to a host file, planted by a sandbox process between
// a check in the socket directory and the rename, whose target a chmod
// would follow) is removed unchanged, ErrPermissionDenied.
func moveSocket(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	fi, err := os.Lstat(to)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		_ = os.Remove(to)
		return fmt.Errorf("%s is not a socket (%s): %w", from, fi.Mode().Type(), errdefs.ErrPermissionDenied)
	}
	if err := os.Lchown(to, 0, 0); err != nil {
		return err
	}
	return os.Chmod(to, 0o600)
}

// logTail is the end of the guest log, for an error message ("" when it is
// empty). What the guest wrote is untrusted: it is only quoted.
func logTail(spec runtime.Spec) string {
	f, err := os.Open(filepath.Join(spec.StateDir, guestLogName))
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return quoteGuestLog(b)
}

// quoteGuestLog renders the end of a guest log for an error message: the
// error of gvinit's JSON failure line when it is one, else the text, always
// quoted (the guest's output is untrusted) and at most a few KiB; "" for
// an empty log.
func quoteGuestLog(b []byte) string {
	const max = 2048
	if len(b) > max {
		b = b[len(b)-max:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	var fl gvinit.Failure
	if json.Unmarshal([]byte(s), &fl) == nil && fl.Error != "" {
		s = fl.Error
		if len(s) > max {
			s = s[:max]
		}
	}
	return " (guest log: " + strconv.Quote(s) + ")"
}
