// Package upgrade is the runner hot-swap API (api/upgrade.go): staging an
// agentbox binary as a runner (validated by a locked-down self-check),
// listing the runners in place with the sandboxes on each, and moving a
// sandbox's guest onto another runner.
//
// It sits above the sandbox core (internal/sandbox). It owns the runner
// store's policy (which binary a request names, the id range a self-check
// runs in); the swap itself, with the sandbox's lock held exclusively
// (wake, restart on the new runner, version check, the fallback chain,
// pause or hibernate again), is the core's UpgradeGuest
// (internal/sandbox/core_upgrade.go), since every step of it is a guest
// start or stop. The core never imports this package. See
// docs/EXTENSIONS.md.
package upgrade

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runner"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Sandboxes is what Upgrades needs of the sandbox core; *sandbox.Manager
// implements it.
type Sandboxes interface {
	// UpgradeGuest swaps a sandbox's guest onto a validated runner.
	UpgradeGuest(ctx context.Context, id string, rn runner.Runner) (api.UpgradeResult, error)
	// ListSandboxes lists the sandboxes, for the runners each runs.
	ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	// Report shows an upgrade to the core's observers.
	Report(ctx context.Context, op sandbox.Op)
}

var _ Sandboxes = (*sandbox.Manager)(nil)

// Config configures Upgrades.
type Config struct {
	// RunnerDir is the daemon's own runner (sandbox.Config.RunnerDir);
	// its parent is the runner store.
	RunnerDir string
	// IDs is the canonical host id range (sandbox.Config.IDs): runner
	// directories are owned by its host id.
	IDs runtime.IDMap
	// IDRanges (nil: none) leases the range an uploaded binary's
	// self-check runs as (sandbox.Config.IDRanges).
	IDRanges sandbox.IDRanges
	// Version is the daemon's version: its own runner's.
	Version   string
	Sandboxes Sandboxes
	Logger    *slog.Logger
}

// Upgrades serves the runner API. Its methods are safe for concurrent
// use: runner directories are immutable and staged atomically, and an
// upgrade holds its sandbox's lock.
type Upgrades struct {
	cfg Config
	log *slog.Logger
}

// New returns the runner API over cfg.
func New(cfg Config) *Upgrades {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Upgrades{cfg: cfg, log: log}
}

// store is the store of runner directories: the parent of the daemon's
// own runner.
func (u *Upgrades) store() *runner.Store {
	s := &runner.Store{Root: filepath.Dir(u.cfg.RunnerDir), UID: u.cfg.IDs.HostID, GID: u.cfg.IDs.HostID}
	if rs := u.cfg.IDRanges; rs != nil {
		// An uploaded binary's self-check runs as the root of a range of
		// its own, never as the canonical range that owns the layers.
		s.Lease = func() (uint32, func(), error) {
			r, err := rs.Alloc()
			if err != nil {
				return 0, nil, err
			}
			return r.HostID, func() { rs.Release(r) }, nil
		}
	}
	return s
}

// defaultRunner is the hash of the daemon's own runner.
func (u *Upgrades) defaultRunner() string { return filepath.Base(u.cfg.RunnerDir) }

// StageRunner stages the agentbox binary read from r as a runner,
// validating it first (runner.Store.Stage).
func (u *Upgrades) StageRunner(ctx context.Context, r io.Reader) (api.Runner, error) {
	rn, err := u.store().Stage(ctx, r)
	if err != nil {
		return api.Runner{}, err
	}
	u.log.InfoContext(ctx, "runner staged", "runner", rn.Hash, "version", rn.GuestVersion())
	return u.apiRunner(rn.Hash, rn.Version, rn.Build), nil
}

// ListRunners lists the runners in place with the sandboxes running each.
// Versions are not listed (that would run every self-check again); builds
// are read from the binaries.
func (u *Upgrades) ListRunners(ctx context.Context) ([]api.Runner, error) {
	rs := u.store()
	hashes, err := rs.List()
	if err != nil {
		return nil, err
	}
	out := make([]api.Runner, 0, len(hashes))
	for _, h := range hashes {
		build, err := runner.Build(filepath.Join(rs.Dir(h), runner.BinaryName))
		if err != nil {
			continue // a directory without a binary is no runner
		}
		version := ""
		if h == u.defaultRunner() {
			version = u.cfg.Version
		}
		out = append(out, u.apiRunner(h, version, build))
	}
	return out, nil
}

func (u *Upgrades) apiRunner(hash, version, build string) api.Runner {
	r := api.Runner{Hash: hash, Version: version, Build: build, GuestVersion: runner.GuestVersion(version, build), Default: hash == u.defaultRunner()}
	if version == "" {
		r.GuestVersion = ""
	}
	sbs, _ := u.cfg.Sandboxes.ListSandboxes(context.Background(), nil)
	for _, sb := range sbs {
		if sb.Runner == hash {
			r.Sandboxes = append(r.Sandboxes, sb.ID)
		}
	}
	sort.Strings(r.Sandboxes)
	return r
}

// resolve stages or opens the runner req names and validates it.
func (u *Upgrades) resolve(ctx context.Context, req api.UpgradeRequest) (runner.Runner, error) {
	rs := u.store()
	switch {
	case req.Runner != "" && req.RunnerHash != "":
		return runner.Runner{}, fmt.Errorf("set runner or runner_hash, not both: %w", errdefs.ErrInvalidArgument)
	case req.Runner != "":
		if !filepath.IsAbs(req.Runner) {
			return runner.Runner{}, fmt.Errorf("runner path %q is not absolute: %w", req.Runner, errdefs.ErrInvalidArgument)
		}
		return rs.StageFile(ctx, req.Runner)
	case req.RunnerHash != "":
		return rs.Open(ctx, req.RunnerHash)
	default:
		return rs.Open(ctx, u.defaultRunner())
	}
}

// UpgradeSandbox moves sandbox id's guest onto the runner req names (the
// daemon's own when it names none), validated first. A running sandbox
// stays running, a paused one is paused again and a hibernated one
// hibernated again afterwards; its processes are restarted in every case,
// its files untouched. On failure the error says what the sandbox runs
// now (sandbox.Manager.UpgradeGuest). Observers see an OpUpgrade.
func (u *Upgrades) UpgradeSandbox(ctx context.Context, id string, req api.UpgradeRequest) (_ api.UpgradeResult, err error) {
	defer func() { u.cfg.Sandboxes.Report(ctx, sandbox.Op{Kind: sandbox.OpUpgrade, Sandbox: id, Err: err}) }()
	rn, err := u.resolve(ctx, req)
	if err != nil {
		return api.UpgradeResult{}, fmt.Errorf("upgrading sandbox %s: %w", id, err)
	}
	return u.cfg.Sandboxes.UpgradeGuest(ctx, id, rn)
}
