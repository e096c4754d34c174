package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// Resource limits (api/limits.go): cpu, memory (no swap), pids and open
// files are enforced by the backend (cgroups, RLIMIT_NOFILE set by the
// guest for every process); the writable layer's size and inodes by a disk
// quota (disk.go). A request's zero fields take the template's
// defaults (TemplateSpec.Resources), then the daemon's.

// Bounds of the limits a request may ask for.
const (
	maxDiskBytes = 16 << 40
	minOpenFiles = 64 // the guest itself needs some
	maxOpenFiles = 1 << 20
)

func validateLimits(r api.Resources) error {
	switch {
	case r.DiskBytes < 0 || r.DiskInodes < 0 || r.OpenFiles < 0:
		return fmt.Errorf("disk_bytes, disk_inodes and open_files must be non-negative: %w", errdefs.ErrInvalidArgument)
	case r.DiskBytes != 0 && (r.DiskBytes < diskquota.MinBytes || r.DiskBytes > maxDiskBytes):
		return fmt.Errorf("disk_bytes must be between %d and %d: %w", diskquota.MinBytes, int64(maxDiskBytes), errdefs.ErrInvalidArgument)
	case r.DiskInodes != 0 && r.DiskInodes < 1024:
		return fmt.Errorf("disk_inodes must be at least 1024: %w", errdefs.ErrInvalidArgument)
	case r.OpenFiles != 0 && (r.OpenFiles < minOpenFiles || r.OpenFiles > maxOpenFiles):
		return fmt.Errorf("open_files must be between %d and %d: %w", minOpenFiles, maxOpenFiles, errdefs.ErrInvalidArgument)
	}
	return nil
}

// bytesPerDefaultInode scales the daemon's default inode limit down for a
// smaller disk: a sandbox whose disk_bytes is below the default and that
// sets no disk_inodes gets one inode per this many bytes (ext4's own
// ratio), at least 1024, at most the default.
const bytesPerDefaultInode = 16 << 10

// resolveResources fills req's zero fields from tmpl's defaults, then the
// daemon's, and validates the result. The daemon's default disk limit
// (Config.DefaultResources.DiskBytes) gives every sandbox a writable
// layer of bounded size unless the daemon's config turned it off: a
// request cannot ask for "none" (0 is "the default").
func (m *Manager) resolveResources(req api.Resources, tmpl templates.Template) (api.Resources, error) {
	res := req
	layers := []api.Resources{m.cfg.DefaultResources}
	if tmpl.Spec.Resources != nil {
		layers = append([]api.Resources{*tmpl.Spec.Resources}, layers...)
	}
	for _, d := range layers {
		fill(&res.CPUs, d.CPUs)
		fill(&res.MemoryBytes, d.MemoryBytes)
		fill(&res.PidsMax, d.PidsMax)
		fill(&res.DiskBytes, d.DiskBytes)
		fill(&res.OpenFiles, d.OpenFiles)
	}
	for _, d := range layers[:len(layers)-1] { // the template's
		fill(&res.DiskInodes, d.DiskInodes)
	}
	if res.DiskInodes == 0 && res.DiskBytes != 0 {
		res.DiskInodes = DefaultInodes(m.cfg.DefaultResources, res.DiskBytes)
	}
	if err := validateLimits(res); err != nil {
		return api.Resources{}, err
	}
	if res.DiskInodes != 0 && res.DiskBytes == 0 {
		return api.Resources{}, fmt.Errorf("disk_inodes needs disk_bytes: %w", errdefs.ErrInvalidArgument)
	}
	if res.DiskBytes != 0 {
		if err := m.diskAvailable(); err != nil {
			return api.Resources{}, err
		}
	}
	return res, nil
}

// DefaultInodes is the inode limit of a disk of bytes that sets none:
// def's, scaled down for a smaller disk (bytesPerDefaultInode); 0 when def
// has none.
func DefaultInodes(def api.Resources, bytes int64) int64 {
	if def.DiskInodes == 0 {
		return 0
	}
	return min(def.DiskInodes, max(1024, bytes/bytesPerDefaultInode))
}

// checkDiskPolicy refuses a tenant's sandbox a disk limit above the
// daemon's ceiling (Config.MaxDiskBytes, MaxDiskInodes, by default the
// default limit's) or none at all while the daemon has one; the admin's
// sandboxes are not bound.
func (m *Manager) checkDiskPolicy(owner string, r api.Resources) error {
	if tenant.Owner(owner) == api.AdminTenant {
		return nil
	}
	maxBytes, maxInodes := m.maxDisk()
	switch {
	case maxBytes != 0 && (r.DiskBytes == 0 || r.DiskBytes > maxBytes):
		return fmt.Errorf("disk_bytes %d is above the %d bytes a tenant's sandbox may have: %w", r.DiskBytes, maxBytes, errdefs.ErrPermissionDenied)
	case maxInodes != 0 && r.DiskInodes > maxInodes:
		return fmt.Errorf("disk_inodes %d is above the %d inodes a tenant's sandbox may have: %w", r.DiskInodes, maxInodes, errdefs.ErrPermissionDenied)
	}
	return nil
}

// maxDisk is the most disk_bytes and disk_inodes a tenant's sandbox may
// have (0: no ceiling).
func (m *Manager) maxDisk() (bytes, inodes int64) {
	bytes, inodes = m.cfg.MaxDiskBytes, m.cfg.MaxDiskInodes
	if bytes == 0 {
		bytes = m.cfg.DefaultResources.DiskBytes
	}
	if inodes == 0 {
		inodes = m.cfg.DefaultResources.DiskInodes
	}
	return bytes, inodes
}

func fill[T int64 | float64](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// limitState tracks what was last reported per sandbox.
type limitState struct {
	// mu guards oom.
	mu  sync.Mutex
	oom map[string]int64 // OOM kills last seen, by sandbox id
}

// reportLimits fills sb's limit reports (OOM kills, disk usage) from the
// live counters, and records an event when the OOM count grew. It never
// wakes the sandbox; an asleep one reports what it can.
func (m *Manager) reportLimits(ctx context.Context, b *box, sb *api.Sandbox) {
	if u, ok := m.diskUsage(sb.ID); ok {
		sb.Disk = &api.DiskUsage{UsedBytes: u.Bytes, TotalBytes: u.BytesTotal, UsedInodes: u.Inodes, TotalInodes: u.InodesTotal}
	}
	b.mu.Lock()
	rt := b.rt
	b.mu.Unlock()
	st, err := counters(ctx, rt)
	if err != nil {
		sb.OOMKills = m.lastOOM(sb.ID)
		return
	}
	sb.OOMKills = st.OOMKills
	sb.CPUBound = st.CPUBound
	m.noteOOM(ctx, sb.ID, st.OOMKills)
}

func (m *Manager) lastOOM(id string) int64 {
	m.lim.mu.Lock()
	defer m.lim.mu.Unlock()
	return m.lim.oom[id]
}

// noteOOM records an OOM event when sandbox id's count grew past what was
// last seen. The cgroup counter starts at zero with every guest (a wake
// or restore makes a new cgroup), so a smaller count resets the baseline.
func (m *Manager) noteOOM(ctx context.Context, id string, n int64) {
	m.lim.mu.Lock()
	if m.lim.oom == nil {
		m.lim.oom = map[string]int64{}
	}
	prev := m.lim.oom[id]
	m.lim.oom[id] = n
	m.lim.mu.Unlock()
	if n <= prev {
		return
	}
	ev := api.SandboxEvent{
		Time:      time.Now().UTC(),
		SandboxID: id,
		Type:      api.SandboxEventOOM,
		Name:      "oom_kills",
		Value:     float64(n),
		Message:   fmt.Sprintf("memory limit reached: %d process(es) killed", n-prev),
	}
	// The event recorder (an Observer, internal/sandboxevents) keeps it.
	m.observe(ctx, Op{Kind: OpEvent, Sandbox: id, Event: &ev, At: ev.Time})
	m.log.WarnContext(ctx, "sandbox OOM kill", "sandbox", id, "oom_kills", n)
}

// checkOOM samples sandbox b's OOM counter after a process exited killed:
// an OOM kill is reported as an event even when nobody inspects the
// sandbox. It returns the count, and false when it could not be read.
func (m *Manager) checkOOM(b *box) (int64, bool) {
	n, ok := m.oomKills(b)
	if ok {
		m.noteOOM(context.Background(), b.id(), n)
	}
	return n, ok
}

// oomKills reads sandbox b's OOM kill count from its backend; false when
// the backend does not report it (or the sandbox has no guest).
func (m *Manager) oomKills(b *box) (int64, bool) {
	b.mu.Lock()
	rt := b.rt
	b.mu.Unlock()
	st, err := counters(context.Background(), rt)
	if err != nil {
		return 0, false
	}
	return st.OOMKills, true
}

// watchOOM wraps an exec or attach stream: a process that exits killed by
// SIGKILL (what the OOM killer sends) makes the Manager sample the OOM
// counter, and when the sandbox's OOM kill count grew while the stream was
// open, the exit event says OOMKilled.
func (m *Manager) watchOOM(b *box, s execstream.Stream) execstream.Stream {
	before, _ := m.oomKills(b)
	return &oomStream{Stream: s, m: m, b: b, before: before}
}

type oomStream struct {
	execstream.Stream
	m      *Manager
	b      *box
	before int64 // the sandbox's OOM kills when the stream opened
}

// Next implements execstream.Stream.
func (s *oomStream) Next() (api.ExecEvent, error) {
	ev, err := s.Stream.Next()
	if err == nil && ev.Type == api.EventExit && ev.Signal == "KILL" && !ev.TimedOut {
		if n, ok := s.m.checkOOM(s.b); ok && n > s.before {
			ev.OOMKilled = true
		}
	}
	return ev, err
}
