package gvisor

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/gvisor/gvinit"
)

// Memory checkpoints: runsc checkpoint of a running sandbox, runsc
// restore into a new one.
//
// The sentry cannot save a host socket (the guest's listener, bound
// through the gofer with --host-uds=create, and the host's connections to
// it), so the guest lets go of the host first: the backend sends it a
// quiesce on its control socket (gvinit), and the guest closes every
// socket to the host and waits to bind them again, which it can only once
// the backend opens the socket directory to it again. After the save the
// backend does that for the source (left running); a restored sandbox
// starts from a fresh bundle whose directory is open, exactly as a
// created one, so the guest's first bind after the restore is claimed as
// Create claims it. No process of the sandbox ever sees a difference but
// the time that passed.
//
// A restored sandbox's hostname is its own spec's, not the image's: runsc
// restore sets every UTS namespace of the image whose hostname no process
// changed (sethostname) to the new bundle's (gVisor's
// UTSNamespace.RestoreSpecValues), and no sandbox process can change the
// sandbox's (it needs CAP_SYS_ADMIN, which none holds: a process's own
// new UTS namespace keeps its own name). TestMemoryCheckpointRestore and
// test/TestGvisorMemoryForkIdentity hold a runsc upgrade to it.
//
// The window: while the host has the socket directory open for the guest
// to bind again, every process of the sandbox can create, remove or
// connect to anything there. The guest serves no connection made from
// inside the sentry (gvinit's peer.go), so a process there gets no
// challenge it could relay; whatever the host finds there it moves out of
// the sandbox's reach before it looks at it (claimSocket: a file that is
// not a socket is removed untouched), and only then proves it with the
// nonce (claimVerified), removing what fails; after maxClaims failures the
// directory is closed and the sandbox stopped, so that it is reported lost
// instead of running without a guest (test/TestGvisorReconnectWindowAttacks
// attacks all of it from inside).

var (
	_ runtime.MemoryCheckpointer = (*sandbox)(nil)
	_ runtime.MemoryRestorer     = (*Backend)(nil)
)

const (
	quiesceTimeout = 10 * time.Second
	rebindTimeout  = 30 * time.Second
	// proveTimeout bounds one proof; maxClaims is how many times the
	// sockets are claimed before the guest counts as lost.
	proveTimeout = 2 * time.Second
	maxClaims    = 5
	// nonceFile holds, beside runsc's image, the nonce the guest in that
	// image answers with (claimVerified).
	nonceFile = "agentbox-nonce"
	// maxExchange bounds what the host reads on one connection of
	// dialGuest: a challenge, a proof and an answer are far less.
	maxExchange = 1024
)

// RestoreMemory implements runtime.MemoryRestorer: Create with runsc
// restore --image-path=dir in place of runsc run.
func (b *Backend) RestoreMemory(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	if dir == "" {
		return nil, fmt.Errorf("restoring sandbox %s: no memory image: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		return nil, fmt.Errorf("restoring sandbox %s: memory image %s: %v: %w", spec.ID, dir, err, errdefs.ErrFailedPrecondition)
	}
	return b.create(ctx, spec, dir)
}

// CheckpointMemory implements runtime.MemoryCheckpointer: the guest lets
// go of the host, the sandbox is paused, frozen runs, runsc checkpoint
// --leave-running writes the image, the sandbox resumes and its guest's
// sockets are claimed again.
func (s *sandbox) CheckpointMemory(ctx context.Context, dir string, frozen func() error) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("checkpointing sandbox %s: destroyed: %w", s.spec.ID, errdefs.ErrNotFound)
	}
	bdir := s.st.Bundle
	nonce := rand.Text()
	if err := os.WriteFile(filepath.Join(dir, nonceFile), []byte(nonce), 0o600); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", s.spec.ID, err)
	}
	if err := quiesce(ctx, filepath.Join(bdir, ctlSocket), s.st.Nonce, nonce); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", s.spec.ID, err)
	}
	s.st.Nonce = nonce
	// From here on the guest waits for its socket directory: open it
	// again on every path.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rebindTimeout)
		defer cancel()
		if rerr := s.reclaim(rctx, nonce); rerr != nil {
			// The guest is out of reach for good (what answered in its
			// place was never talked to): the sandbox is stopped, so
			// that it is reported lost (its Wait ends) rather than left
			// running without a guest.
			s.log.WarnContext(ctx, "guest lost after a memory checkpoint: stopping the sandbox", "err", rerr)
			if kerr := s.b.deleteContainer(rctx, s.spec.ID); kerr != nil {
				rerr = errors.Join(rerr, kerr)
			}
			err = errors.Join(err, fmt.Errorf("checkpointing sandbox %s: reconnecting its guest: %w", s.spec.ID, rerr))
		}
	}()
	if _, err := s.b.runsc(ctx, "pause", s.spec.ID); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", s.spec.ID, err)
	}
	defer func() {
		if _, rerr := s.b.runsc(context.WithoutCancel(ctx), "resume", s.spec.ID); rerr != nil {
			if st, serr := s.b.containerState(context.WithoutCancel(ctx), s.spec.ID); serr != nil || st.Status != "running" {
				err = errors.Join(err, fmt.Errorf("checkpointing sandbox %s: resuming: %w", s.spec.ID, rerr))
			}
		}
	}()
	if frozen != nil {
		if err := frozen(); err != nil {
			return err
		}
	}
	if _, err := s.b.runsc(ctx, "checkpoint", "--leave-running", "--image-path="+dir, s.spec.ID); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", s.spec.ID, err)
	}
	return nil
}

// quiesce asks the guest on its control socket, authenticated with the
// current nonce cur, to close every socket to the host, and waits until it
// has (its answer, then end of file); next is the new nonce.
func quiesce(ctx context.Context, ctl, cur, next string) error {
	ctx, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	c, br, challenge, err := dialGuest(ctx, ctl)
	if err != nil {
		return fmt.Errorf("guest control socket: %w", err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, gvinit.HostProof(cur, challenge)+" "+gvinit.QuiescePrefix+next+"\n"); err != nil {
		return fmt.Errorf("asking the guest to quiesce: %w", err)
	}
	reply, err := io.ReadAll(io.LimitReader(br, 64))
	if err != nil {
		return fmt.Errorf("asking the guest to quiesce: %w", err)
	}
	if string(reply) != gvinit.QuiesceReply {
		return fmt.Errorf("the guest answered quiesce with %q: %w", reply, errdefs.ErrInternal)
	}
	return nil
}

// dialGuest dials one of the guest's sockets (again while it refuses:
// bound, not yet listening) and reads the guest's challenge.
func dialGuest(ctx context.Context, path string) (net.Conn, *bufio.Reader, string, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, "", errors.Join(errdefs.ErrDeadlineExceeded, err)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		// What answers may be a sandbox process's socket (claimVerified):
		// it gets no more of the host's memory than an exchange needs.
		br := bufio.NewReader(io.LimitReader(c, maxExchange))
		line, err := br.ReadString('\n')
		if err != nil || len(line) != 65 {
			c.Close()
			return nil, nil, "", fmt.Errorf("no challenge from the guest (%q): %w", line, errors.Join(errdefs.ErrPermissionDenied, err))
		}
		return c, br, strings.TrimSuffix(line, "\n"), nil
	}
}

// reclaim opens the socket directory to the sandbox again and claims
// the guest's sockets once it has bound them (claimVerified).
func (s *sandbox) reclaim(ctx context.Context, nonce string) error {
	udir := filepath.Join(s.st.Bundle, bundleSocket)
	ids := layerIDs(s.spec)
	for _, p := range []string{s.spec.SocketPath, filepath.Join(s.st.Bundle, ctlSocket)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Chown(udir, int(ids.HostID), int(ids.HostID)); err != nil {
		return err
	}
	if err := os.Chmod(udir, 0o700); err != nil {
		return err
	}
	return claimVerified(ctx, udir, s.spec.SocketPath, nonce, ids.HostID, s.done)
}

// placeholders binds (and closes) host sockets at the guest's two socket
// paths in udir, owned by host root (the guest's own are the sandbox
// root's). A restored sentry walks every file its image knows of, the
// guest's sockets among them (its dentries outlive the sockets, which the
// host moved away), and fails unless each is there with its type; the
// guest replaces them when it binds again (gvinit's listen unlinks).
func placeholders(udir string) error {
	for _, name := range []string{gvinit.SocketName, gvinit.CtlName} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(udir, name), Net: "unix"})
		if err != nil {
			return fmt.Errorf("socket placeholder: %w", err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
	}
	return nil
}

// claimVerified waits until both of the guest's sockets are in udir
// (sockets owned by owner, the sandbox's root on the host: not the
// placeholders),
// claims them (claimSocket: moved out of the sandbox's reach, udir closed
// to it) and only then checks that they are the guest's: the guest
// socket's first connection and the control socket's Hello must both
// answer nonce, which only the guest knows. udir is open to every process
// of the sandbox while the guest binds: what is found there may be
// another process's socket, or no socket at all.
func claimVerified(ctx context.Context, udir, sockPath, nonce string, owner uint32, done <-chan struct{}) error {
	// A socket is there once it is a socket of the sandbox's root that
	// answers: the sentry listens on it, so the gofer has finished binding
	// it. (Claimed earlier, between the gofer's bind and its own open of
	// the new file, the guest's bind fails, EIO, and leaves behind a
	// socket nobody listens on: a claim that waits out proveTimeout.)
	bound := func(name string) bool {
		var st unix.Stat_t
		p := filepath.Join(udir, name)
		return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK && st.Uid == owner && answers(p)
	}
	ctlPath := filepath.Join(filepath.Dir(udir), ctlSocket)
	for attempt := 1; ; attempt++ {
		for !bound(gvinit.SocketName) || !bound(gvinit.CtlName) {
			select {
			case <-done:
				return fmt.Errorf("the sandbox exited before its guest listened: %w", errdefs.ErrInternal)
			case <-ctx.Done():
				return fmt.Errorf("waiting for the guest: %w", errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
			case <-time.After(time.Millisecond):
			}
		}
		err := claimSocket(filepath.Join(udir, gvinit.SocketName), sockPath, udir)
		if err == nil {
			if err = proveBoth(ctx, sockPath, ctlPath, nonce); err == nil {
				return nil
			}
		}
		// What was claimed is not the guest's (a sandbox process's
		// socket or file, or one of a bind of the guest's that failed
		// inside the sentry but left its file on the host): it goes, so
		// that nothing of the host ever talks to it.
		for _, p := range []string{sockPath, ctlPath} {
			if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				return errors.Join(err, rerr)
			}
		}
		if attempt == maxClaims || ctx.Err() != nil || errors.Is(err, errdefs.ErrInternal) {
			// The window closes: the guest is lost (the caller reports
			// it so), and nothing of the sandbox binds there any more.
			return errors.Join(err, closeDir(udir))
		}
		// The guest binds both again once the directory is open.
		if cerr := os.Chown(udir, int(owner), int(owner)); cerr != nil {
			return errors.Join(err, cerr)
		}
		if cerr := os.Chmod(udir, 0o700); cerr != nil {
			return errors.Join(err, cerr)
		}
	}
}

// closeDir gives the socket directory udir back to host root, 0555: no
// process of the sandbox can create anything there.
func closeDir(udir string) error {
	if err := os.Chown(udir, 0, 0); err != nil {
		return err
	}
	return os.Chmod(udir, 0o555)
}

// answers reports whether the socket at path accepts a connection (which
// it closes at once, unused). path is in a directory the sandbox can
// write to: it is dialled through a descriptor of what is there, opened
// without following a symlink and checked to be a socket, so that no
// other file of the host is ever reached.
func answers(path string) bool {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return false
	}
	c, err := net.DialTimeout("unix", "/proc/self/fd/"+strconv.Itoa(fd), 100*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// proveBoth checks the claimed sockets (out of the sandbox's reach:
// what lies there stays what it is) with the nonce.
func proveBoth(ctx context.Context, sockPath, ctlPath, nonce string) error {
	for _, p := range []string{sockPath, ctlPath} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("claimed guest socket %s is not a socket: %w", p, errdefs.ErrPermissionDenied)
		}
	}
	if err := prove(ctx, sockPath, nonce); err != nil {
		return fmt.Errorf("guest socket: %w", err)
	}
	if err := prove(ctx, ctlPath, nonce); err != nil {
		return fmt.Errorf("guest control socket: %w", err)
	}
	return nil
}

// prove dials path, proves the host to whatever answers and wants the
// guest's proof back (gvinit's auth.go): only the guest knows nonce.
func prove(ctx context.Context, path, nonce string) error {
	ctx, cancel := context.WithTimeout(ctx, proveTimeout)
	defer cancel()
	c, br, challenge, err := dialGuest(ctx, path)
	if err != nil {
		return err
	}
	defer c.Close()
	mine := gvinit.Challenge()
	if _, err := io.WriteString(c, gvinit.HostProof(nonce, challenge)+" "+gvinit.ProveCommand+mine+"\n"); err != nil {
		return err
	}
	got, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(strings.TrimSuffix(got, "\n")), []byte(gvinit.GuestProof(nonce, mine))) {
		return fmt.Errorf("it is not the guest's (wrong proof): %w", errdefs.ErrPermissionDenied)
	}
	return nil
}

// readNonce reads the nonce CheckpointMemory stored with an image.
func readNonce(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, nonceFile))
	if err != nil {
		return "", fmt.Errorf("memory image %s: %w", dir, err)
	}
	return string(b), nil
}
