package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/templates"
)

// fakeDisk records what the Manager asks of its DiskQuota.
type fakeDisk struct {
	mu      sync.Mutex
	limits  map[string]diskquota.Limits // applied, by sandbox id
	mounted map[string]bool
	calls   []string
}

func newFakeDisk() *fakeDisk {
	return &fakeDisk{limits: map[string]diskquota.Limits{}, mounted: map[string]bool{}}
}

func (f *fakeDisk) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeDisk) Method() string { return "fake" }

func (f *fakeDisk) Apply(ctx context.Context, dir, id string, lim diskquota.Limits) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("apply %s", id)
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		return fmt.Errorf("dir %s not fresh and empty: %d entries, %v", dir, len(entries), err)
	}
	f.limits[id] = lim
	f.mounted[id] = true
	return nil
}

func (f *fakeDisk) Usage(dir, id string) (diskquota.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim, ok := f.limits[id]
	if !ok || !f.mounted[id] {
		return diskquota.Usage{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return diskquota.Usage{Bytes: 4096, BytesTotal: lim.Bytes, Inodes: 3, InodesTotal: lim.Inodes}, nil
}

func (f *fakeDisk) Remove(ctx context.Context, dir, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.limits[id]; ok {
		f.record("remove %s", id)
	}
	delete(f.limits, id)
	delete(f.mounted, id)
	return nil
}

func (f *fakeDisk) IDs() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.limits {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

func (f *fakeDisk) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// fakeMountDisk is a fakeDisk whose dirs are filesystems of their own.
type fakeMountDisk struct{ *fakeDisk }

func (f fakeMountDisk) Mount(dir, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.limits[id]; ok {
		f.record("mount %s", id)
		f.mounted[id] = true
	}
	return nil
}

func (f fakeMountDisk) Unmount(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.limits {
		if filepath.Base(dir) == id {
			if f.mounted[id] {
				f.record("unmount %s", id)
			}
			f.mounted[id] = false
		}
	}
	return nil
}

// The Manager applies the quota to the fresh sandbox dir before anything
// is made in it, reports its usage and method, and removes it on delete;
// a method with mounts is unmounted on hibernate and mounted on wake; a
// method without needs neither.
func TestDiskQuotaLifecycle(t *testing.T) {
	for _, mounts := range []bool{false, true} {
		t.Run(fmt.Sprintf("mounts=%v", mounts), func(t *testing.T) {
			m, _, _ := newTestManager(t)
			fd := newFakeDisk()
			m.cfg.DiskQuota = fd
			if mounts {
				m.cfg.DiskQuota = fakeMountDisk{fd}
			}
			ctx := context.Background()
			if info, _ := m.Info(ctx); info.DiskQuota != "fake" {
				t.Fatalf("Info.DiskQuota = %q", info.DiskQuota)
			}
			id := createTest(t, m, api.CreateSandboxRequest{Resources: api.Resources{DiskBytes: 32 << 20, DiskInodes: 4096}})
			plain := createTest(t, m, api.CreateSandboxRequest{})
			if got := fd.limits[id]; got != (diskquota.Limits{Bytes: 32 << 20, Inodes: 4096}) {
				t.Fatalf("applied %+v", got)
			}
			if _, ok := fd.limits[plain]; ok {
				t.Fatal("a sandbox without disk_bytes got a quota")
			}
			sb, err := m.GetSandbox(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if sb.Disk == nil || sb.Disk.TotalBytes != 32<<20 || sb.Disk.TotalInodes != 4096 || sb.Disk.UsedBytes != 4096 {
				t.Fatalf("inspect disk = %+v", sb.Disk)
			}
			if _, err := m.SetState(ctx, id, api.StateHibernated); err != nil {
				t.Fatal(err)
			}
			sb, _ = m.GetSandbox(ctx, id)
			if mounts != (sb.Disk == nil) {
				t.Fatalf("hibernated: disk %+v (mounts %v)", sb.Disk, mounts)
			}
			if _, err := m.SetState(ctx, id, api.StateRunning); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := m.DeleteSandbox(ctx, plain); err != nil {
				t.Fatal(err)
			}
			want := []string{"apply " + id, "remove " + id}
			if mounts {
				want = []string{"apply " + id, "unmount " + id, "mount " + id, "remove " + id}
			}
			if got := fd.log(); !slices.Equal(got, want) {
				t.Fatalf("calls %v, want %v", got, want)
			}
		})
	}
}

// Recover removes the quotas of sandboxes it has no record of.
func TestDiskQuotaRecoverRemovesOrphans(t *testing.T) {
	m, _, _ := newTestManager(t)
	fd := newFakeDisk()
	fd.limits["orphan1"] = diskquota.Limits{Bytes: 16 << 20}
	m.cfg.DiskQuota = fd
	if err := m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fd.log(); !slices.Equal(got, []string{"remove orphan1"}) {
		t.Fatalf("calls %v", got)
	}
}

// Without a DiskQuota, disk limits are refused with the reason.
func TestDiskQuotaUnavailable(t *testing.T) {
	m, _, _ := newTestManager(t)
	m.cfg.DiskQuotaErr = fmt.Errorf("no loop devices: %w", errdefs.ErrFailedPrecondition)
	_, err := m.resolveResources(api.Resources{DiskBytes: 32 << 20}, templates.Template{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no loop devices") {
		t.Fatalf("resolveResources: %v", err)
	}
	if info, _ := m.Info(context.Background()); info.DiskQuota != "" {
		t.Fatalf("Info.DiskQuota = %q", info.DiskQuota)
	}
}

// The method names are the API's.
func TestDiskQuotaMethodNames(t *testing.T) {
	if diskquota.MethodProject != api.DiskQuotaXFSProject || diskquota.MethodLoop != api.DiskQuotaLoopExt4 {
		t.Fatalf("diskquota methods %q %q, api %q %q", diskquota.MethodProject, diskquota.MethodLoop, api.DiskQuotaXFSProject, api.DiskQuotaLoopExt4)
	}
}

// The daemon's default disk limit: a request without disk_bytes gets it,
// with its inodes; a smaller disk_bytes gets inodes scaled to it (one per
// 16 KiB, at least 1024, at most the default); a template's inodes win.
// A tenant may not go above the ceiling (by default the default), nor
// above the inode ceiling; the admin may.
func TestDefaultDiskLimit(t *testing.T) {
	m, _, _ := newTestManager(t)
	m.cfg.DiskQuota = newFakeDisk()
	m.cfg.DefaultResources.DiskBytes, m.cfg.DefaultResources.DiskInodes = 10<<30, 512<<10
	for _, tc := range []struct {
		req, tmpl     api.Resources
		bytes, inodes int64
	}{
		{api.Resources{}, api.Resources{}, 10 << 30, 512 << 10},
		{api.Resources{DiskBytes: 64 << 20}, api.Resources{}, 64 << 20, 4096},
		{api.Resources{DiskBytes: 16 << 20}, api.Resources{}, 16 << 20, 1024},
		{api.Resources{DiskBytes: 1 << 40}, api.Resources{}, 1 << 40, 512 << 10},
		{api.Resources{DiskBytes: 64 << 20, DiskInodes: 2048}, api.Resources{}, 64 << 20, 2048},
		{api.Resources{}, api.Resources{DiskBytes: 1 << 30, DiskInodes: 5000}, 1 << 30, 5000},
		{api.Resources{}, api.Resources{DiskBytes: 1 << 30}, 1 << 30, 65536},
	} {
		tmpl := templates.Template{}
		tmpl.Spec.Resources = &tc.tmpl
		res, err := m.resolveResources(tc.req, tmpl)
		if err != nil || res.DiskBytes != tc.bytes || res.DiskInodes != tc.inodes {
			t.Errorf("resolve %+v (template %+v) = disk %d, inodes %d, %v; want %d, %d", tc.req, tc.tmpl, res.DiskBytes, res.DiskInodes, err, tc.bytes, tc.inodes)
		}
	}

	for _, tc := range []struct {
		owner               string
		bytes, inodes       int64
		maxBytes, maxInodes int64
		ok                  bool
	}{
		{"acme", 10 << 30, 512 << 10, 0, 0, true},
		{"acme", 64 << 20, 4096, 0, 0, true},
		{"acme", 20 << 30, 512 << 10, 0, 0, false},
		{"acme", 10 << 30, 1 << 20, 0, 0, false},
		{"acme", 0, 0, 0, 0, false}, // no limit at all
		{"acme", 20 << 30, 1 << 20, 20 << 30, 1 << 20, true},
		{"acme", 30 << 30, 1 << 20, 20 << 30, 1 << 20, false},
		{api.AdminTenant, 1 << 40, 1 << 22, 0, 0, true},
		{api.AdminTenant, 0, 0, 0, 0, true},
	} {
		m.cfg.MaxDiskBytes, m.cfg.MaxDiskInodes = tc.maxBytes, tc.maxInodes
		err := m.checkDiskPolicy(tc.owner, api.Resources{DiskBytes: tc.bytes, DiskInodes: tc.inodes})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrPermissionDenied)) {
			t.Errorf("%s with disk %d, inodes %d under max %d, %d: %v; want ok %v", tc.owner, tc.bytes, tc.inodes, tc.maxBytes, tc.maxInodes, err, tc.ok)
		}
	}
	m.cfg.MaxDiskBytes, m.cfg.MaxDiskInodes = 0, 0
	info, _ := m.Info(context.Background())
	if info.DefaultDiskBytes != 10<<30 || info.DefaultDiskInodes != 512<<10 || info.MaxDiskBytes != 10<<30 || info.MaxDiskInodes != 512<<10 {
		t.Errorf("Info: %+v", info)
	}

	// Turned off by the daemon's config: no limit, no ceiling.
	m.cfg.DefaultResources.DiskBytes, m.cfg.DefaultResources.DiskInodes = 0, 0
	if res, err := m.resolveResources(api.Resources{}, templates.Template{}); err != nil || res.DiskBytes != 0 || res.DiskInodes != 0 {
		t.Errorf("without a default: %+v, %v", res, err)
	}
	if err := m.checkDiskPolicy("acme", api.Resources{}); err != nil {
		t.Errorf("without a default: %v", err)
	}
}
