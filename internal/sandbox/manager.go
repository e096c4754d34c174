// Package sandbox is the daemon's core: it owns the life of every sandbox
// from create to delete, wiring the isolation backend (internal/runtime), the
// template and layer stores, the in-sandbox guest client and the metadata
// store. Every trigger (API, CLI, SDK, schedules and webhooks) reaches
// sandboxes only through the Manager's methods, so metering, audit and
// policy have one place to live.
//
// Features (secrets and run tokens, events, tunnels, network policy,
// checkpoints, restore, fork, diff and merge, warm pools) are not called by
// the core: they are Extensions, given to New, that attach through the
// extension points of hooks.go (core_snapshot.go and core_pool.go add the
// core's API for checkpoints and for warm pools). This package imports no
// feature package; see docs/EXTENSIONS.md.
//
// Concurrency: Manager methods are safe for concurrent use. Operations on one
// sandbox are ordered by that sandbox's lifecycle lock: exec and file calls
// share it, delete takes it exclusively, so a delete waits for calls that are
// being set up and later calls see the sandbox gone. Long-running exec
// streams do not hold the lock; deleting a sandbox ends them.
package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Config configures a Manager.
type Config struct {
	// DataDir holds sandboxes/<id>/{upper,work,state}.
	DataDir string
	// RunDir holds the per-sandbox guest sockets (sb/<id>.sock); it must be
	// short (unix socket paths are limited to 108 bytes) and root-only.
	RunDir string
	// RunnerDir holds the guest binary ("agentbox") mounted read-only into
	// every sandbox at /.agentbox; see runner.Install.
	RunnerDir string
	// IDs is the canonical host uid/gid range: layers, upper and work dirs
	// are owned by it on disk, and, without IDRanges, every sandbox's ids
	// 0..Size-1 map onto it.
	IDs runtime.IDMap
	// IDRanges, when set, gives every sandbox (and build step) a host id
	// range of its own (package idrange); the backend shows it the files
	// of IDs through idmapped mounts.
	IDRanges IDRanges
	// DefaultTemplate is used when a create request names none.
	DefaultTemplate string
	// DefaultResources fill in zero fields of a create request. Its
	// DiskBytes and DiskInodes are the default disk limit (limits.go).
	DefaultResources api.Resources
	// MaxDiskBytes and MaxDiskInodes bound the disk limits of tenants'
	// sandboxes; 0: DefaultResources' (limits.go).
	MaxDiskBytes, MaxDiskInodes int64
	// DiskQuota enforces disk_bytes and disk_inodes (disk.go); nil refuses
	// sandboxes that ask for them, with DiskQuotaErr as the reason.
	DiskQuota    DiskQuota
	DiskQuotaErr error
	// Layers is the layer store templates live in; checkpoints
	// (internal/snapshot) are layers of it, and sandboxes forked or
	// restored run on them (LayerOwner).
	Layers *layers.Store
	// Version is the daemon's version, reported by Info.
	Version string
	Logger  *slog.Logger
	// Clock drives idle policies and lifetimes (lifecycle.go); nil is the
	// real clock. Tests inject a fake one.
	Clock clock.Clock
	// Quotas admits new sandboxes, layers and runs against their
	// tenant's quotas (tenancy.go); nil limits nothing. It is given at
	// construction, not set later, so that nothing the Manager starts
	// (recovery, warm pools, the daemon's scheduler) can run before
	// admission is in place.
	Quotas Quotas
	// NewTemplates builds the template store (see TemplatesFactory),
	// unless New is given one.
	NewTemplates TemplatesFactory
	// Extensions are the features attached to the core (hooks.go), in
	// the order their hooks run. They are fixed at construction: New
	// provisions them before it returns, so nothing the Manager starts
	// can run without them.
	Extensions []Extension
}

// IDRanges allocates per-sandbox host id ranges (package idrange).
type IDRanges interface {
	// Alloc returns a free range; errdefs.ErrResourceExhausted when none is.
	Alloc() (runtime.IDMap, error)
	// Adopt marks a recovered sandbox's range in use.
	Adopt(runtime.IDMap) error
	// Release frees a range once its sandbox's processes and files are gone.
	Release(runtime.IDMap)
}

// Manager creates, tracks, recovers and destroys sandboxes.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	backends  *runtime.Registry // the backend of each sandbox by name (backends.go)
	templates Templates
	store     store.Store
	lc        lifecycleState
	lim       limitState // OOM reporting; see limits.go
	hooks     hooks      // the extensions' hooks; see hooks.go

	// mu guards the fields below.
	mu        sync.Mutex
	sandboxes map[string]*box
	closed    bool
}

// box is the Manager's view of one sandbox.
type box struct {
	// life orders operations on the sandbox: calls take it shared while
	// they set up, delete takes it exclusively.
	life sync.RWMutex

	guest *client.Client

	// mu guards the fields below.
	mu      sync.Mutex
	rec     store.SandboxRecord
	rt      runtime.Sandbox
	deleted bool
	expiry  clock.Timer
	lc      boxLifecycle // idle accounting; see lifecycle.go
	// hidden is the holder of a hidden sandbox until it is handed out
	// (core_pool.go); "" for every other sandbox.
	hidden string
}

// New returns a Manager running sandboxes on backends, with the template
// store tmpl, or, when tmpl is nil, the one cfg.NewTemplates builds. Call
// Recover once before serving requests.
func New(cfg Config, backends *runtime.Registry, tmpl Templates, st store.Store) (*Manager, error) {
	if cfg.DataDir == "" || cfg.RunDir == "" || cfg.RunnerDir == "" || backends == nil {
		return nil, fmt.Errorf("sandbox manager: data, run and runner dirs and backends are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultTemplate == "" {
		cfg.DefaultTemplate = "busybox"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	// Both are for host root only: the backend hands a guest its mounts,
	// so no sandbox uid ever resolves a path below the data dir.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(cfg.DataDir, "sandboxes"), 0o700}, {filepath.Join(cfg.RunDir, "sb"), 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("sandbox manager: %w", err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("sandbox manager: %w", err)
		}
	}
	hs, err := collectHooks(cfg.Extensions)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		backends:  backends,
		templates: tmpl,
		store:     st,
		hooks:     hs,
		sandboxes: make(map[string]*box),
	}
	if tmpl == nil && cfg.NewTemplates != nil {
		t, err := cfg.NewTemplates(m.stepRunner())
		if err != nil {
			return nil, err
		}
		m.templates = t
	}
	if err := m.provision(cfg.Extensions); err != nil {
		return nil, err
	}
	return m, nil
}

// Info reports the daemon's version, backend and number of sandboxes.
func (m *Manager) Info(ctx context.Context) (api.Info, error) {
	caps := m.backends.Default().Capabilities()
	m.mu.Lock()
	n := len(m.sandboxes)
	m.mu.Unlock()
	maxBytes, maxInodes := m.maxDisk()
	return api.Info{
		Version:           m.cfg.Version,
		API:               api.Version,
		Backend:           caps.Name,
		Capabilities:      append([]string(nil), caps.Features...),
		CgroupMode:        caps.CgroupMode,
		DataDir:           m.cfg.DataDir,
		Sandboxes:         n,
		Backends:          m.backendInfos(),
		DiskQuota:         m.diskQuotaMethod(),
		DefaultDiskBytes:  m.cfg.DefaultResources.DiskBytes,
		DefaultDiskInodes: m.cfg.DefaultResources.DiskInodes,
		MaxDiskBytes:      maxBytes,
		MaxDiskInodes:     maxInodes,
	}, nil
}

// ListSandboxes returns the sandboxes whose labels include every pair in
// labels, oldest first.
func (m *Manager) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	p := tenant.From(ctx)
	m.mu.Lock()
	boxes := make([]*box, 0, len(m.sandboxes))
	for _, b := range m.sandboxes {
		if !b.isHidden() && p.Sees(b.owner()) {
			boxes = append(boxes, b)
		}
	}
	m.mu.Unlock()
	out := make([]api.Sandbox, 0, len(boxes))
	for _, b := range boxes {
		sb := b.view()
		if matchLabels(sb.Labels, labels) {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// GetSandbox returns one sandbox, with its live limit reports (OOM kills,
// disk usage).
func (m *Manager) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.get(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb := b.view()
	m.reportLimits(ctx, b, &sb)
	return sb, nil
}

// get returns sandbox id for the caller of ctx. A hidden sandbox (not
// handed out yet) and another tenant's sandbox are ErrNotFound, exactly
// like an unknown id: this is where tenants are kept apart, since every
// call naming a sandbox comes through here.
func (m *Manager) get(ctx context.Context, id string) (*box, error) {
	m.mu.Lock()
	b, ok := m.sandboxes[id]
	m.mu.Unlock()
	if !ok || b.isHidden() || !tenant.From(ctx).Sees(b.owner()) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return b, nil
}

// owner is the tenant the sandbox belongs to.
func (b *box) owner() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return tenant.Owner(b.rec.Sandbox.Tenant)
}

func (b *box) view() api.Sandbox {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb := b.rec.Sandbox
	sb.Env = cloneMap(sb.Env)
	sb.Labels = cloneMap(sb.Labels)
	if sb.Idle != nil {
		idle := *sb.Idle
		sb.Idle = &idle
	}
	if t := b.lc.lastActive; !t.IsZero() {
		t = t.UTC()
		sb.LastActivityAt = &t
	}
	return sb
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// idLen is the length of the ids newID makes.
const idLen = 12

// newID returns a fresh sandbox id: idLen characters of [a-z0-9]
// (ValidName keeps names from having this shape).
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var buf [idLen]byte
	if _, err := rand.Read(buf[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	for i := range buf {
		buf[i] = alphabet[int(buf[i])%len(alphabet)]
	}
	return string(buf[:])
}

// sandboxPaths are the host paths of one sandbox.
type sandboxPaths struct {
	dir, upper, work, state, socket string
}

func (m *Manager) paths(id string) sandboxPaths {
	dir := filepath.Join(m.cfg.DataDir, "sandboxes", id)
	return sandboxPaths{
		dir:    dir,
		upper:  filepath.Join(dir, "upper"),
		work:   filepath.Join(dir, "work"),
		state:  filepath.Join(dir, "state"),
		socket: filepath.Join(m.cfg.RunDir, "sb", id+".sock"),
	}
}

// Close stops expiry timers and forgets the sandboxes without touching them:
// a daemon that shuts down leaves its sandboxes running for the next one to
// re-adopt.
func (m *Manager) Close() error {
	m.closeExtensions()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, b := range m.sandboxes {
		b.mu.Lock()
		if b.expiry != nil {
			b.expiry.Stop()
		}
		b.stopIdleLocked()
		b.mu.Unlock()
	}
	return nil
}
