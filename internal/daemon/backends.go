package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/gvisor"
	"github.com/agentbox/agentbox/internal/runtime/native"
)

// backendEnv is what the daemon's backends are built from.
type backendEnv struct {
	cfg *config.Config
	log *slog.Logger
	// runnerDir holds the daemon's runner (the guest binary).
	runnerDir string
	// realDataDir is cfg.DataDir with symlinks resolved.
	realDataDir string
	// idRanges cuts the sandboxes' host id range into slots; ids is its
	// canonical slot, the owner of every layer on disk.
	idRanges *idrange.Allocator
	ids      runtime.IDMap
}

// backendFactory builds one backend of the daemon.
type backendFactory struct {
	name string
	make func(backendEnv) (runtime.Backend, error)
}

// builtinBackends are the backends a daemon builds, by name; a
// configuration (--runtime) or a create request (runtime) chooses among
// them. Adding a backend is one entry here (see docs/CONTRACTS.md,
// "Adding a backend").
var builtinBackends = []backendFactory{
	{native.Name, newNativeBackend},
	{gvisor.Name, newGvisorBackend},
}

// checkRuntime refuses, before the daemon makes anything, a default
// runtime (cfg.Runtime) that is none of the backends it can build.
func checkRuntime(cfg *config.Config, factories []backendFactory, extra []runtime.Backend) error {
	def := cfg.Runtime
	if def == "" {
		def = config.DefaultRuntime
	}
	var names []string
	for _, f := range factories {
		names = append(names, f.name)
	}
	for _, b := range extra {
		names = append(names, b.Capabilities().Name)
	}
	if slices.Contains(names, def) {
		return nil
	}
	return fmt.Errorf("runtime %q: no such backend (this daemon has %s): %w", def, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
}

// newBackends builds the registry of the daemon's backends, whose default
// is cfg.Runtime: those of factories, except any extra replaces (the one
// of its name), then extra. A backend other than the default that cannot
// start on this host is left out with a warning: the sandboxes recorded on
// it are left as they are until a daemon that runs it starts (Manager
// Recover), and marked unavailable in the registry, so a create asking
// for it says why. On error every backend built is closed again.
func newBackends(env backendEnv, factories []backendFactory, extra []runtime.Backend) (_ *runtime.Registry, err error) {
	def := env.cfg.Runtime
	if def == "" {
		def = config.DefaultRuntime
	}
	given := map[string]bool{}
	for _, b := range extra {
		given[b.Capabilities().Name] = true
	}
	var built []runtime.Backend
	unavailable := map[string]error{}
	defer func() {
		if err != nil {
			for i := len(built) - 1; i >= 0; i-- {
				if c, ok := built[i].(runtime.Closer); ok {
					_ = c.Close()
				}
			}
		}
	}()
	for _, f := range factories {
		if given[f.name] {
			continue
		}
		b, err := f.make(env)
		switch {
		case err != nil && f.name == def:
			return nil, fmt.Errorf("starting the %s backend: %w", f.name, err)
		case err != nil:
			env.log.Warn("backend unavailable; sandboxes recorded on it are left as they are", "backend", f.name, "err", err)
			unavailable[f.name] = err
			continue
		case b.Capabilities().Name != f.name:
			built = append(built, b)
			return nil, fmt.Errorf("backend %s calls itself %q", f.name, b.Capabilities().Name)
		}
		built = append(built, b)
	}
	reg, err := runtime.NewRegistry(def, append(built, extra...)...)
	if err != nil {
		return nil, err
	}
	for name, why := range unavailable {
		reg.MarkUnavailable(name, why)
	}
	env.log.Info("backends", "default", reg.DefaultName(), "all", reg.Names())
	return reg, nil
}

// newNativeBackend builds the native backend of a daemon: its own cgroup
// parent, locked for its life (derived from the data dir unless
// configured), so a neighbour's start-up sweep never sees this one's
// sandboxes or prespawned guests; and cfg.Prespawn guests kept started, so
// a create skips the clone, the exec of the runner, its start-up and its
// move into a cgroup (see native.Prespawn).
func newNativeBackend(env backendEnv) (runtime.Backend, error) {
	cfg := env.cfg
	parent := cfg.EffectiveCgroupParent(env.realDataDir)
	env.log.Info("cgroup parent", "parent", parent, "derived", cfg.CgroupParent == "")
	b, err := native.New(native.Config{Logger: env.log, CgroupParent: parent, OwnParent: true, CPUYield: cfg.CPUYieldOn(), Forker: filepath.Join(env.runnerDir, "agentbox"), Prespawn: prespawn(cfg, &native.Prespawn{
		Size:      cfg.Prespawn,
		RunnerDir: env.runnerDir,
		IDs:       env.idRanges,
		LayerIDs:  env.ids,
		SocketDir: filepath.Join(filepath.Dir(cfg.SocketPath), "sb"),
		LogDir:    filepath.Join(cfg.DataDir, "sandboxes", ".zygotes"),
		// Every path of a sandbox's spec is in the data dir; a waiting
		// zygote holds no other mount of the host.
		Keep: []string{filepath.Clean(cfg.DataDir)},
	})})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// prespawn is p, or nil (no guests kept started) when cfg.Prespawn is 0.
func prespawn(cfg *config.Config, p *native.Prespawn) *native.Prespawn {
	if cfg.Prespawn == 0 {
		return nil
	}
	return p
}

// newGvisorBackend builds the gvisor backend of a daemon: runsc from the
// configuration (or install-deps' cache, or $PATH), its root beside the
// sandboxes' sockets in the run dir (the guest's socket is renamed from
// there into place, so they must share a filesystem; /run outlives a
// daemon restart but not a reboot, as the sandboxes), and a cgroup parent
// of its own next to native's. Without runsc it fails
// (errdefs.ErrFailedPrecondition, saying how to install it) and the daemon
// runs without it.
func newGvisorBackend(env backendEnv) (runtime.Backend, error) {
	cfg := env.cfg
	return gvisor.New(gvisor.Config{
		Runsc:        cfg.Runsc,
		Root:         filepath.Join(filepath.Dir(cfg.SocketPath), "gvisor"),
		Platform:     cfg.GvisorPlatform,
		CgroupParent: cfg.EffectiveCgroupParent(env.realDataDir) + "-gvisor",
		Logger:       env.log,
	})
}
