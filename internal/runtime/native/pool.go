package native

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
)

// Prespawn configures guests started ahead of need ("zygotes"). A zygote has
// its namespaces created, its uid/gid maps written and its Go runtime
// initialised, and waits (outside any sandbox cgroup, having read nothing
// of any sandbox) for its config. Create hands the config of the sandbox it
// is building to a waiting zygote instead of forking a new guest, which
// takes the clone, the exec of the runner and the runtime start-up off the
// create path. A zygote is used only for a spec with the same runner and id
// maps; anything else starts cold.
type Prespawn struct {
	// Size is how many zygotes are kept waiting (default 1).
	Size int
	// RunnerDir must equal that of the specs served.
	RunnerDir string
	// IDs, when set, gives every zygote a host id range of its own,
	// allocated when it is started and freed when it is discarded unused;
	// Backend.ClaimIDRange hands one's range (and ownership of it) to the
	// caller, whose Create with that range then uses it. No zygote is
	// started before Backend.FillPool (call it once the ranges of
	// recovered sandboxes are marked in use). Without IDs all zygotes
	// share UIDMap/GIDMap and serve specs with those maps.
	IDs            IDAllocator
	UIDMap, GIDMap runtime.IDMap
	// LayerIDs, with IDs, is the range the specs' layers are owned by on
	// disk: a zygote's idmap user namespace (mounts.go) is made with it,
	// off the create path.
	LayerIDs runtime.IDMap
	// SocketDir holds the zygotes' listening sockets until a Create renames
	// one to its spec's SocketPath (same filesystem required; otherwise
	// the zygote is not used).
	SocketDir string
	// LogDir holds the zygotes' logs until a Create renames one into its
	// spec's StateDir; one on another filesystem gets a symlink to the
	// log, which stays in LogDir until the sandbox is destroyed (moveLog).
	LogDir string
	// Keep lists the host directories (absolute, clean, none within
	// another) under which every path of a spec served lies: layers,
	// upper and work dirs, state dir, runner dir. A waiting zygote's
	// mount namespace holds only these, bound at their own paths, and a
	// /proc, /sys and the device nodes of its own (nsinit.EnvKeep), so
	// it pins no other mount of the host: none another daemon makes and
	// unmounts while it waits. A spec with a path elsewhere starts cold.
	// Empty: a zygote keeps its copy of the host's whole mount table
	// while it waits.
	Keep []string
}

// IDAllocator hands out host id ranges (package idrange).
type IDAllocator interface {
	Alloc() (runtime.IDMap, error)
	Release(runtime.IDMap)
}

// zygote is a started guest waiting for its config.
type zygote struct {
	g        *guestProc
	cg       *cgroupV1 // a cgroup of its own, renamed to the sandbox's on claim
	sockPath string
	logPath  string
	ids      runtime.IDMap
	// release frees ids when the zygote is discarded; nil once its range
	// was claimed (the claimer owns it) or when ranges are not allocated.
	release func()
}

// zygotePool keeps Prespawn.Size zygotes ready. Safe for concurrent use.
type zygotePool struct {
	cfg          Prespawn
	log          *slog.Logger
	cgroupParent string
	forker       *guestForker // nil: zygotes are forked by this process
	keepEnv      string       // nsinit.EnvKeep=<Keep as JSON>, or "" without Keep
	idmaps       *idmapCache

	// spawning counts the zygotes being started; close waits for them, so
	// that no guest is left behind by a daemon that exits right after.
	// Add is called with mu held and closed false only.
	spawning sync.WaitGroup

	// mu guards the fields below.
	mu      sync.Mutex
	ready   []*zygote
	claimed map[runtime.IDMap]*zygote // by range; see claim
	filling int
	closed  bool
}

// testHookSpawned, when set, is called with a new zygote's pid before it
// is waited for (tests close the pool there).
var testHookSpawned func(p *zygotePool, pid int)

const zygotePrefix = ".zygote-"

// newZygotePool starts the pool. It needs cgroup v1 controllers (hybrid or
// legacy hosts): there a guest's move into a cgroup waits for an RCU grace
// period, which a zygote pays in the background and a claim avoids by
// renaming the zygote's cgroup. On pure v2 hosts a cold guest is born in its
// cgroup (CLONE_INTO_CGROUP) and no pool is kept: it returns nil.
func newZygotePool(cfg Prespawn, mode, cgroupParent string, forker *guestForker, idmaps *idmapCache, log *slog.Logger) (*zygotePool, error) {
	if mode == "v2" {
		log.Debug("cgroup v2: guests are started cold, born in their cgroup")
		return nil, nil
	}
	if cfg.Size <= 0 {
		cfg.Size = 1
	}
	for _, d := range []string{cfg.RunnerDir, cfg.SocketDir, cfg.LogDir} {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("prespawn: path %q is not absolute", d)
		}
	}
	keepEnv := ""
	if len(cfg.Keep) > 0 {
		b, err := json.Marshal(cfg.Keep)
		if err != nil {
			return nil, fmt.Errorf("prespawn: %w", err)
		}
		if _, err := nsinit.ParseKeep(string(b)); err != nil {
			return nil, fmt.Errorf("prespawn: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		keepEnv = nsinit.EnvKeep + "=" + string(b)
	}
	if err := os.MkdirAll(cfg.SocketDir, 0o700); err != nil {
		return nil, fmt.Errorf("prespawn: %w", err)
	}
	if err := os.MkdirAll(cfg.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("prespawn: %w", err)
	}
	// Zygotes of an earlier daemon exited when it did (their config pipe
	// closed); remove what they left.
	for _, d := range []string{cfg.SocketDir, cfg.LogDir} {
		old, _ := filepath.Glob(filepath.Join(d, zygotePrefix+"*"))
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	// (Their cgroups are removed by the backend before the pool starts:
	// Backend.removeZygoteCgroups.)
	p := &zygotePool{cfg: cfg, log: log, cgroupParent: cgroupParent, forker: forker, keepEnv: keepEnv, idmaps: idmaps}
	if cfg.IDs == nil {
		go p.fill()
	}
	// With IDs the first fill waits for Backend.FillPool: a zygote must
	// not take a range a recovered sandbox still runs in.
	return p, nil
}

func (p *zygotePool) matches(spec runtime.Spec) bool {
	if spec.RunnerDir != p.cfg.RunnerDir || spec.UIDMap != p.cfg.UIDMap || spec.GIDMap != p.cfg.GIDMap {
		return false
	}
	if len(p.cfg.Keep) == 0 {
		return true
	}
	for _, path := range append([]string{spec.UpperDir, spec.WorkDir, spec.RunnerDir, spec.StateDir}, spec.Layers...) {
		if !nsinit.Under(filepath.Clean(path), p.cfg.Keep) {
			return false
		}
	}
	return true
}

// claim reserves a live zygote for the next take with its range and hands
// the range (and the duty to free it) to the caller. Only with
// Prespawn.IDs. Claiming one starts a refill in the background.
func (p *zygotePool) claim() (runtime.IDMap, bool) {
	if p == nil || p.cfg.IDs == nil {
		return runtime.IDMap{}, false
	}
	defer func() { go p.fill() }()
	for {
		p.mu.Lock()
		if p.closed || len(p.ready) == 0 {
			p.mu.Unlock()
			return runtime.IDMap{}, false
		}
		z := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		select {
		case <-z.g.done:
			p.mu.Unlock()
			z.discard()
			continue
		default:
		}
		z.release = nil
		if old := p.claimed[z.ids]; old != nil {
			// Claimed before and never used: its range was freed and
			// allocated again. Cannot happen (a range is allocated once
			// until freed), but never keep two guests for one range.
			go old.discard()
		}
		if p.claimed == nil {
			p.claimed = map[runtime.IDMap]*zygote{}
		}
		p.claimed[z.ids] = z
		p.mu.Unlock()
		return z.ids, true
	}
}

// take returns a live zygote for spec, moved onto spec's socket path and
// log path, or nil when none is ready (the caller starts a guest cold).
// With Prespawn.IDs only the zygote claimed for spec's range is used.
// Taking one starts a refill in the background.
func (p *zygotePool) take(spec runtime.Spec) *zygote {
	if p == nil || spec.RunnerDir != p.cfg.RunnerDir {
		return nil
	}
	if p.cfg.IDs != nil {
		if spec.UIDMap != spec.GIDMap {
			return nil
		}
		p.mu.Lock()
		z := p.claimed[spec.UIDMap]
		delete(p.claimed, spec.UIDMap)
		p.mu.Unlock()
		if z == nil {
			return nil
		}
		select {
		case <-z.g.done:
			z.discard()
			return nil
		default:
		}
		if err := z.moveTo(spec); err != nil {
			p.log.Debug("zygote not usable for this spec; starting cold", "err", err)
			z.discard()
			return nil
		}
		return z
	}
	if !p.matches(spec) {
		return nil
	}
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			go p.fill()
			return nil
		}
		z := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		p.mu.Unlock()
		go p.fill()
		select {
		case <-z.g.done:
			z.discard()
			continue
		default:
		}
		if err := z.moveTo(spec); err != nil {
			p.log.Debug("zygote not usable for this spec; starting cold", "err", err)
			p.put(z)
			return nil
		}
		return z
	}
}

// moveTo renames the zygote's socket and log to spec's paths.
func (z *zygote) moveTo(spec runtime.Spec) error {
	if err := os.MkdirAll(filepath.Dir(spec.SocketPath), 0o700); err != nil {
		return err
	}
	if fi, err := os.Lstat(spec.SocketPath); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("socket path %s exists and is not a socket", spec.SocketPath)
		}
		if err := os.Remove(spec.SocketPath); err != nil {
			return err
		}
	}
	logDst := filepath.Join(spec.StateDir, guestLogName)
	moved, err := moveLog(z.logPath, logDst, spec.ID)
	if err != nil {
		return err
	}
	if err := os.Rename(z.sockPath, spec.SocketPath); err != nil {
		if moved != logDst {
			_ = os.Remove(logDst)
		}
		_ = os.Rename(moved, z.logPath)
		return err
	}
	return nil
}

// moveLog renames a zygote's log, src, to dst and returns where the log
// now is. When dst is on another filesystem (a sandbox dir with a disk
// quota is a filesystem of its own) the log stays in the zygotes' log dir,
// renamed for sandbox id (keptLogName), and dst is a symlink to it, which
// removeFiles follows to delete it: the guest keeps writing the file it
// was started with either way.
func moveLog(src, dst, id string) (string, error) {
	err := os.Rename(src, dst)
	if err == nil {
		return dst, nil
	}
	if !errors.Is(err, unix.EXDEV) {
		return "", err
	}
	kept := filepath.Join(filepath.Dir(src), keptLogName(id))
	if err := os.Rename(src, kept); err != nil {
		return "", err
	}
	_ = os.Remove(dst) // a previous guest's (a woken sandbox)
	if err := os.Symlink(kept, dst); err != nil {
		_ = os.Rename(kept, src)
		return "", err
	}
	return kept, nil
}

// keptLogName names the log of sandbox id's guest kept in the zygotes' log
// dir (moveLog).
func keptLogName(id string) string { return ".sandbox-" + id + ".log" }

// removeKeptLog deletes the log moveLog kept for spec's guest, if any.
func removeKeptLog(spec runtime.Spec) error {
	if spec.StateDir == "" {
		return nil
	}
	target, err := os.Readlink(filepath.Join(spec.StateDir, guestLogName))
	if err != nil || filepath.Base(target) != keptLogName(spec.ID) {
		return nil // no log kept: a file, or nothing
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (p *zygotePool) put(z *zygote) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		z.discard()
		return
	}
	p.ready = append(p.ready, z)
}

// fill starts zygotes until Size are ready or being started.
func (p *zygotePool) fill() {
	for {
		p.mu.Lock()
		if p.closed || len(p.ready)+p.filling >= p.cfg.Size {
			p.mu.Unlock()
			return
		}
		p.filling++
		p.spawning.Add(1)
		p.mu.Unlock()
		if !p.fillOne() {
			return
		}
	}
}

// fillOne starts one zygote and adds it to the ready ones, or discards it
// when the pool closed meanwhile. It reports whether filling may go on.
func (p *zygotePool) fillOne() bool {
	defer p.spawning.Done()
	z, err := p.spawn()
	p.mu.Lock()
	p.filling--
	if err != nil {
		p.mu.Unlock()
		p.log.Warn("starting a zygote guest", "err", err)
		return false
	}
	if p.closed {
		p.mu.Unlock()
		z.discard()
		return false
	}
	p.ready = append(p.ready, z)
	p.mu.Unlock()
	return true
}

func (p *zygotePool) spawn() (*zygote, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := zygotePrefix + hex.EncodeToString(rnd[:])
	z := &zygote{
		sockPath: filepath.Join(p.cfg.SocketDir, name+".sock"),
		logPath:  filepath.Join(p.cfg.LogDir, name+".log"),
	}
	lnFile, err := listen(z.sockPath)
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()
	logFile, err := os.OpenFile(z.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		_ = os.Remove(z.sockPath)
		return nil, fmt.Errorf("zygote log: %w", err)
	}
	defer logFile.Close()
	cg, err := newCgroupV1("/"+p.cgroupParent+"/"+name, runtime.Resources{})
	if err != nil {
		_ = os.Remove(z.sockPath)
		_ = os.Remove(z.logPath)
		return nil, err
	}
	z.cg = cg.(*cgroupV1)
	z.ids, err = p.ids()
	if err != nil {
		_ = z.cg.delete()
		_ = os.Remove(z.sockPath)
		_ = os.Remove(z.logPath)
		return nil, err
	}
	if p.cfg.IDs != nil {
		ids := z.ids
		z.release = func() { p.cfg.IDs.Release(ids) }
	}
	fail := func(err error) (*zygote, error) {
		_ = z.cg.delete()
		_ = os.Remove(z.sockPath)
		_ = os.Remove(z.logPath)
		if z.release != nil {
			z.release()
		}
		return nil, err
	}
	// Born in a delegated cgroup of the unified hierarchy of its own, for
	// its per-exec cgroups (execcgroup.go), owned by its own root; the v1
	// cgroups are joined below.
	cgfd := -1
	if dir, err := newUnifiedDir("/"+p.cgroupParent+"/"+name, z.ids.HostID, z.ids.HostID); err != nil {
		return fail(err)
	} else if dir != "" {
		z.cg.unified = dir
		if cgfd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return fail(fmt.Errorf("opening cgroup dir: %w", err))
		}
		defer unix.Close(cgfd)
	}
	g, err := spawnGuest(p.forker, p.cfg.RunnerDir, z.ids, z.ids, lnFile, logFile, cgfd, p.keepEnv)
	if err != nil {
		return fail(err)
	}
	z.g = g
	if testHookSpawned != nil {
		testHookSpawned(p, g.pid)
	}
	if err := z.cg.addProc(g.pid); err != nil {
		z.discard()
		return nil, err
	}
	// Ready only once it waits for its config, its start-up all done.
	if err := g.waitFor(nsinit.SyncWaiting, teardownTimeout); err != nil {
		z.discard()
		return nil, fmt.Errorf("zygote guest: %w", err)
	}
	if p.cfg.IDs != nil && p.cfg.LayerIDs.Size != 0 && p.cfg.LayerIDs != z.ids && p.idmaps != nil {
		if _, err := p.idmaps.get(filepath.Join(p.cfg.RunnerDir, "agentbox"), p.cfg.LayerIDs, z.ids, z.ids); err != nil {
			p.log.Warn("preparing a zygote's idmap", "err", err) // Create tries again
		}
	}
	return z, nil
}

// ids is the range of a new zygote: one of its own with Prespawn.IDs, else
// the shared UIDMap (which must then equal GIDMap).
func (p *zygotePool) ids() (runtime.IDMap, error) {
	if p.cfg.IDs != nil {
		return p.cfg.IDs.Alloc()
	}
	if p.cfg.UIDMap != p.cfg.GIDMap {
		return runtime.IDMap{}, fmt.Errorf("prespawn: uid map %+v and gid map %+v differ", p.cfg.UIDMap, p.cfg.GIDMap)
	}
	return p.cfg.UIDMap, nil
}

// waitFor reads exactly len(want) bytes from the guest's sync pipe within d
// and checks they are want.
func (g *guestProc) waitFor(want string, d time.Duration) error {
	if err := g.syncR.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	defer g.syncR.SetReadDeadline(time.Time{})
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(g.syncR, buf); err != nil {
		return fmt.Errorf("waiting for the guest to start: %w", err)
	}
	if string(buf) != want {
		return fmt.Errorf("guest reported %q before its config", buf)
	}
	return nil
}

// discard kills a zygote that will not be used and removes its files.
func (z *zygote) discard() {
	_ = unix.Kill(z.g.pid, unix.SIGKILL)
	z.g.cfgW.Close()
	z.g.syncR.Close()
	select {
	case <-z.g.done:
	case <-time.After(teardownTimeout):
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	_ = z.cg.killAll(ctx)
	_ = z.cg.delete()
	_ = os.Remove(z.sockPath)
	_ = os.Remove(z.logPath)
	if z.release != nil {
		z.release()
		z.release = nil
	}
}

// close discards every waiting or claimed zygote and waits until those
// being started are discarded too; later takes return nil.
func (p *zygotePool) close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	for _, z := range p.claimed {
		ready = append(ready, z)
	}
	p.claimed = nil
	p.mu.Unlock()
	p.spawning.Wait()
	var errs []error
	for _, z := range ready {
		z.discard()
		if _, err := os.Stat(z.sockPath); err == nil {
			errs = append(errs, fmt.Errorf("zygote socket %s left", z.sockPath))
		}
	}
	return errors.Join(errs...)
}
