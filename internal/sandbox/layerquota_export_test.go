package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/layergc"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/testutil"
)

// fakeQuotas admits sandboxes and runs, and layers through an
// AdmitRecorder whose "recorded" is whether LayerBytes counts the layer.
type fakeQuotas struct {
	testutil.AdmitRecorder
}

func (q *fakeQuotas) AdmitSandboxes(ctx context.Context, tenant string, n int, disk int64) (int64, func(), error) {
	return disk, func() {}, nil
}

func (q *fakeQuotas) AdmitRun(ctx context.Context, tenant string) error { return nil }

func (q *fakeQuotas) AdmitLayer(ctx context.Context, tn, layer string) (func(), error) {
	return q.Admit(tn, layer)
}

// layerManager is a test Manager with a layer store, a template manager
// admitting through it, and a catalogue template "busybox" (one layer).
func layerManager(t *testing.T) (*Manager, *fakeQuotas, layers.Layer) {
	t.Helper()
	testutil.RequiresRoot(t)
	m, _, _ := newTestManager(t)
	ctx := context.Background()
	ls, err := layers.New(filepath.Join(t.TempDir(), "layers"), m.cfg.IDs)
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.Layers = ls
	tm, err := templates.New(templates.Config{DataDir: filepath.Join(t.TempDir(), "templates"), Layers: ls, Admit: m.admitTemplateLayer})
	if err != nil {
		t.Fatal(err)
	}
	m.templates = tm
	dir, err := ls.TempDir("base-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "base"), []byte(strings.Repeat("b", 1<<16)), 0o644); err != nil {
		t.Fatal(err)
	}
	base, err := ls.CreateFromDir(ctx, dir, layers.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tm.Adopt(ctx, "busybox-img", base.ID, nil); err != nil {
		t.Fatal(err)
	}
	q := &fakeQuotas{}
	q.Recorded = func(tn, layer string) bool {
		n, _ := m.layerBytes(context.Background(), tn, nil)
		with, _ := m.layerBytes(context.Background(), tn, []string{layer})
		return n == with
	}
	m.cfg.Quotas = q
	return m, q, base
}

// createOn starts a sandbox of tenant on the layer chain topped by top.
func createOn(t *testing.T, m *Manager, tn string, top layers.Layer) string {
	t.Helper()
	id := newID()
	p := m.paths(id)
	sb := api.Sandbox{ID: id, Tenant: tn, State: api.StateCreating, Hostname: id, CreatedAt: m.cfg.Clock.Now()}
	rec := store.SandboxRecord{Sandbox: sb, Layers: []string{top.Path}, UpperDir: p.upper, WorkDir: p.work, SocketPath: p.socket, StateDir: p.state}
	if _, err := m.start(context.Background(), rec, true); err != nil {
		t.Fatal(err)
	}
	return id
}

func writeUpper(t *testing.T, m *Manager, id, name string, size int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.paths(id).upper, name), []byte(strings.Repeat(name[:1], size)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// layerDirs lists the layer store's directories and metadata files.
func layerDirs(t *testing.T, m *Manager) []string {
	t.Helper()
	ents, err := os.ReadDir(m.cfg.Layers.Root())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Name() != "tmp" {
			out = append(out, e.Name())
		}
	}
	return out
}

// For the tests of package sandbox_test, which drive the checkpoint
// feature (internal/snapshot, which imports this package) on a test
// Manager.

// LayerManager is layerManager.
func LayerManager(t *testing.T) (*Manager, *fakeQuotas, layers.Layer) { return layerManager(t) }

// CreateOn is createOn.
func CreateOn(t *testing.T, m *Manager, tn string, top layers.Layer) string {
	return createOn(t, m, tn, top)
}

// WriteUpper is writeUpper.
func WriteUpper(t *testing.T, m *Manager, id, name string, size int) {
	writeUpper(t, m, id, name, size)
}

// LayerDirs is layerDirs.
func LayerDirs(t *testing.T, m *Manager) []string { return layerDirs(t, m) }

// LayersOf returns m's layer store.
func LayersOf(m *Manager) *layers.Store { return m.cfg.Layers }

// CheckpointStoreOf returns m's metadata store's checkpoint records.
func CheckpointStoreOf(m *Manager) store.CheckpointStore { return m.store.(store.CheckpointStore) }

// IDsOf returns m's canonical id range.
func IDsOf(m *Manager) runtime.IDMap { return m.cfg.IDs }

// TemplatesOf returns m's template store (for the template service,
// internal/templatesvc, on a test Manager).
func TemplatesOf(m *Manager) Templates { return m.templates }

// layerBytes is layergc.LayerBytes, the tenant registry's layer meter, on
// m's layer store and checkpoint records.
func (m *Manager) layerBytes(ctx context.Context, owner string, extra []string) (int64, error) {
	cks, _ := m.store.(store.CheckpointStore)
	return layergc.LayerBytes(ctx, m.cfg.Layers, cks, owner, extra)
}

// LayerBytes is layerBytes.
func LayerBytes(ctx context.Context, m *Manager, owner string, extra []string) (int64, error) {
	return m.layerBytes(ctx, owner, extra)
}

// admitTemplateLayer admits a layer template name takes against the disk
// quota of the template's tenant, as the tenant registry's
// AdmitTemplateLayer does for the daemon's template store.
func (m *Manager) admitTemplateLayer(ctx context.Context, name, layer string) (func(), error) {
	if m.cfg.Quotas == nil {
		return func() {}, nil
	}
	owner, _ := tenant.Split(name)
	return m.cfg.Quotas.AdmitLayer(ctx, tenant.Owner(owner), layer)
}
