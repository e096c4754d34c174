// Package inproc is a runtime.Backend for tests: each sandbox's guest is
// served in the calling process (guest.Serve with Options.Embedded, on a
// unix socket at Spec.SocketPath), with no namespaces, no cgroups, no
// overlay and no root needed. It lets the sandbox core, the daemon and the
// feature packages be tested as an unprivileged user, and it passes the
// conformance suite (runtimetest) for what it declares.
//
// What it is not: an isolation backend. Its limits, stated once here:
//   - No isolation (it does not declare runtime.CapIsolation): a sandbox's
//     processes are children of the test process, run as its user on the
//     host's filesystem, see its hostname and every host process.
//   - No overlay: Create copies what the Layers show into UpperDir (see
//     copyUp), and the default guest serves UpperDir as its "/" (file
//     operations, archives, an exec's working directory: see ServeGuest),
//     so what a client writes lands in the writable layer, where
//     checkpoints, diff and fork find it. A command that names an absolute
//     path reaches the host's file.
//   - No limits (no CapCgroups): Spec.Resources is ignored.
//   - Ids: the guest and its processes run as the test process's user.
//     When that is root, what they create in UpperDir is chowned to the
//     sandbox's root (LayerIDs, else UIDMap) after each request that may
//     write, at Pause and at Destroy, as a user namespace would have
//     stored it; a file a background process writes between those is
//     root's meanwhile.
//   - Pause stops (SIGSTOP) the sandbox's processes and holds new guest
//     connections until Resume; connections already open keep being served.
//   - A sandbox's processes are found by a marker variable in their
//     environment (MarkerEnv); a process that clears its environment
//     escapes Destroy. CPU time (Stats) is the sum over the processes alive
//     at the time, so it drops when one exits.
//   - A "restart" is simulated within one process: the guests outlive the
//     Backend value that created them, and another Backend of the same
//     process Recovers them (a process-wide registry). Nothing survives the
//     process.
//
// It must never back a production daemon: nothing registers it there; tests
// construct it with New.
package inproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Name is the backend's name in Capabilities.
const Name = "inproc"

// MarkerEnv is the environment variable every process of a sandbox carries
// (value "<test process pid>:<sandbox id>"), by which Destroy, Pause and
// Stats find them.
const MarkerEnv = "AGENTBOX_INPROC_SANDBOX"

// GuestEnv is what a Guest is given for one sandbox.
type GuestEnv struct {
	Spec runtime.Spec
	// Dir is the sandbox's own directory, its UpperDir: the root of the
	// paths the guest serves (ServeGuest) and the working directory of
	// its commands.
	Dir string
	// Env holds MarkerEnv: every process the guest starts must inherit
	// it, or Destroy will not find it.
	Env map[string]string
}

// Guest serves a sandbox's guest on ln until ctx is done, then returns
// (having closed ln). It runs on a goroutine of its own.
type Guest func(ctx context.Context, ln net.Listener, env GuestEnv) error

// Config configures a Backend.
type Config struct {
	// Guest is the guest served for each sandbox; nil is ServeGuest with
	// Version.
	Guest Guest
	// Version is what the default guest reports (guest Options.Version).
	Version string
	// Logger receives the backend's and the guests' logs; nil discards.
	Logger *slog.Logger
	// Name is the backend's name in Capabilities; "" is Name. A second
	// Backend under another name stands for a second backend (a Manager
	// with two, as a daemon with native and gvisor).
	Name string
}

// Backend serves each sandbox's guest in-process. Its methods are safe for
// concurrent use; Backends of one process share their sandboxes.
type Backend struct {
	cfg Config
	log *slog.Logger
}

// New returns a Backend.
func New(cfg Config) *Backend {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Guest == nil {
		cfg.Guest = ServeGuest(guest.Options{Version: cfg.Version, Logger: cfg.Logger})
	}
	return &Backend{cfg: cfg, log: cfg.Logger}
}

// ServeGuest returns a Guest serving guest.Serve with opts, made Embedded
// and given the sandbox's marker variable, behind a proxy that puts every
// path a client names beneath GuestEnv.Dir: a file written at "/etc/x" is
// Dir/etc/x on the host, an exec without a cwd starts in Dir, and FileInfo
// paths are shown relative to Dir again. Commands run by an exec still see
// the host's filesystem: an absolute path in a command line is the host's.
func ServeGuest(opts guest.Options) Guest {
	return func(ctx context.Context, ln net.Listener, env GuestEnv) error {
		o := opts
		o.Embedded = true
		o.Env = make(map[string]string, len(opts.Env)+len(env.Env))
		for k, v := range opts.Env {
			o.Env[k] = v
		}
		for k, v := range env.Env {
			o.Env[k] = v
		}
		after := func() { giveToSandbox(env.Spec) }
		return serveGuestRooted(ctx, ln, env.Dir, after, func(ctx context.Context, l net.Listener) error {
			return guest.Serve(ctx, l, o)
		})
	}
}

// live is the process-wide registry of running guests by sandbox id: the
// "host" that outlives a Backend, as sandboxes outlive a daemon.
var live = struct {
	sync.Mutex
	m map[string]*sandbox
}{m: map[string]*sandbox{}}

// startSeq makes every guest's start_time distinct.
var startSeq atomic.Int64

var idRE = lazyregexp.New(`^[a-z0-9-]{1,64}$`)

// Capabilities reports what the backend enforces: pausing and stats only.
func (b *Backend) Capabilities() runtime.Capabilities {
	name := b.cfg.Name
	if name == "" {
		name = Name
	}
	return runtime.Capabilities{Name: name, Features: []string{runtime.CapPause, runtime.CapStats}}
}

// Create starts the guest of spec. Layers, UpperDir and RunnerDir's
// "agentbox" must exist (nothing of them is used but UpperDir as the
// guest's working directory). An id already running is ErrAlreadyExists.
// On error nothing of the sandbox is left behind.
func (b *Backend) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if !idRE.MatchString(spec.ID) {
		return nil, fmt.Errorf("inproc: sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := checkSpec(spec); err != nil {
		return nil, fmt.Errorf("inproc: creating %s: %w", spec.ID, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("inproc: creating %s: %w", spec.ID, err)
	}
	live.Lock()
	defer live.Unlock()
	if s, ok := live.m[spec.ID]; ok && !s.stopped() {
		return nil, fmt.Errorf("inproc: sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	if err := copyUp(ctx, spec); err != nil {
		return nil, fmt.Errorf("inproc: creating %s: %w", spec.ID, err)
	}
	s, err := b.start(spec)
	if err != nil {
		return nil, fmt.Errorf("inproc: creating %s: %w", spec.ID, err)
	}
	live.m[spec.ID] = s
	b.log.Debug("inproc sandbox created", "sandbox", spec.ID)
	return s, nil
}

func checkSpec(spec runtime.Spec) error {
	if len(spec.Layers) == 0 {
		return fmt.Errorf("no layers: %w", errdefs.ErrInvalidArgument)
	}
	for _, d := range append([]string{spec.UpperDir}, spec.Layers...) {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("directory %s: %w", d, errdefs.ErrNotFound)
		}
	}
	bin := filepath.Join(spec.RunnerDir, "agentbox")
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("guest binary %s: %w", bin, errdefs.ErrNotFound)
	}
	if spec.SocketPath == "" || spec.StateDir == "" {
		return fmt.Errorf("socket path and state dir are required: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// start creates the state dir and socket and starts the guest; on error it
// removes what it made.
func (b *Backend) start(spec runtime.Spec) (_ *sandbox, err error) {
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(spec.StateDir)
		}
	}()
	if err := os.MkdirAll(filepath.Dir(spec.SocketPath), 0o700); err != nil {
		return nil, err
	}
	_ = os.Remove(spec.SocketPath)
	ln, err := net.Listen("unix", spec.SocketPath)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &sandbox{
		spec:   spec,
		start:  time.Now().UnixNano() + startSeq.Add(1),
		marker: strconv.Itoa(os.Getpid()) + ":" + spec.ID,
		cancel: cancel,
		served: make(chan struct{}),
		done:   make(chan struct{}),
		ln:     newHoldListener(ln),
		log:    b.log,
	}
	env := GuestEnv{Spec: spec, Dir: spec.UpperDir, Env: map[string]string{MarkerEnv: s.marker}}
	go func() {
		defer close(s.served)
		if err := b.cfg.Guest(ctx, s.ln, env); err != nil {
			s.log.Warn("inproc guest stopped", "sandbox", spec.ID, "err", err)
		}
		s.ln.Close()
		killMarked(s.marker)
	}()
	return s, nil
}

// state is what State returns: the process and the guest's start, which a
// Recover must match.
type state struct {
	Pid       int   `json:"pid"`
	StartTime int64 `json:"start_time"`
}

// Recover re-adopts a guest still served by this process; any other state
// is ErrNotFound.
func (b *Backend) Recover(ctx context.Context, spec runtime.Spec, raw []byte) (runtime.Sandbox, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil || st.Pid != os.Getpid() {
		return nil, fmt.Errorf("inproc: recovering %s: %w", spec.ID, errdefs.ErrNotFound)
	}
	live.Lock()
	s, ok := live.m[spec.ID]
	live.Unlock()
	if !ok || s.start != st.StartTime || s.stopped() {
		return nil, fmt.Errorf("inproc: recovering %s: %w", spec.ID, errdefs.ErrNotFound)
	}
	return s, nil
}

// Cleanup stops what is left of spec's sandbox: its guest if still
// served, its marked processes, socket and state dir. Idempotent.
func (b *Backend) Cleanup(ctx context.Context, spec runtime.Spec) error {
	live.Lock()
	s, ok := live.m[spec.ID]
	live.Unlock()
	if ok && s.spec.SocketPath == spec.SocketPath {
		return s.Destroy(ctx)
	}
	killMarked(strconv.Itoa(os.Getpid()) + ":" + spec.ID)
	return removeFiles(spec)
}

func removeFiles(spec runtime.Spec) error {
	var errs []error
	if err := os.Remove(spec.SocketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(spec.StateDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sandbox is one guest served in-process.
type sandbox struct {
	spec   runtime.Spec
	start  int64
	marker string
	cancel context.CancelFunc
	served chan struct{} // closed when the guest has returned
	ln     *holdListener
	log    *slog.Logger

	// mu guards the fields below.
	mu        sync.Mutex
	destroyed bool
	done      chan struct{} // closed by Destroy
}

var (
	_ runtime.Backend     = (*Backend)(nil)
	_ runtime.Sandbox     = (*sandbox)(nil)
	_ runtime.Pauser      = (*sandbox)(nil)
	_ runtime.StatsReader = (*sandbox)(nil)
)

func (s *sandbox) ID() string         { return s.spec.ID }
func (s *sandbox) SocketPath() string { return s.spec.SocketPath }

func (s *sandbox) State() []byte {
	b, _ := json.Marshal(state{Pid: os.Getpid(), StartTime: s.start})
	return b
}

// stopped reports whether the guest has returned.
func (s *sandbox) stopped() bool {
	select {
	case <-s.served:
		return true
	default:
		return false
	}
}

func (s *sandbox) Status(ctx context.Context) (runtime.Status, error) {
	if s.stopped() {
		return runtime.StatusStopped, nil
	}
	return runtime.StatusRunning, nil
}

// Wait returns a channel closed once the guest has returned.
func (s *sandbox) Wait() <-chan struct{} { return s.served }

// Destroy stops the guest, kills the sandbox's marked processes and
// removes its socket and state dir. Idempotent; concurrent calls wait for
// the first.
func (s *sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil
	}
	s.ln.resume()
	s.cancel()
	killMarked(s.marker) // a stopped process ignores the guest's SIGKILL until continued; this one reaches it
	select {
	case <-s.served:
	case <-ctx.Done():
		return fmt.Errorf("inproc: destroying %s: %w", s.spec.ID, ctx.Err())
	}
	killMarked(s.marker)
	giveToSandbox(s.spec)
	if err := removeFiles(s.spec); err != nil {
		return fmt.Errorf("inproc: destroying %s: %w", s.spec.ID, err)
	}
	s.destroyed = true
	close(s.done)
	live.Lock()
	if live.m[s.spec.ID] == s {
		delete(live.m, s.spec.ID)
	}
	live.Unlock()
	return nil
}

// Pause holds new guest connections and stops the sandbox's processes,
// returning once every one is stopped.
func (s *sandbox) Pause(ctx context.Context) error {
	s.ln.hold()
	if err := stopMarked(ctx, s.marker); err != nil {
		return fmt.Errorf("inproc: pausing %s: %w", s.spec.ID, err)
	}
	giveToSandbox(s.spec) // what its processes wrote, before a checkpoint reads it
	return nil
}

// Resume continues the sandbox's processes and serves held connections.
func (s *sandbox) Resume(ctx context.Context) error {
	signalMarked(s.marker, syscall.SIGCONT)
	s.ln.resume()
	return nil
}

// Stats sums the counters of the sandbox's live processes; Pids counts the
// guest too, as a sandbox's PID 1 would be.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	var st runtime.Stats
	for _, pid := range marked(s.marker) {
		cpu, rss, err := procCounters(pid)
		if err != nil {
			continue // exited meanwhile
		}
		st.CPUTime += cpu
		st.MemoryBytes += rss
		st.Pids++
	}
	st.Pids++
	return st, nil
}
