package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
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
	tm, err := templates.New(templates.Config{DataDir: filepath.Join(t.TempDir(), "templates"), Layers: ls, Admit: m.AdmitTemplateLayer})
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
		n, _ := m.LayerBytes(context.Background(), tn, nil)
		with, _ := m.LayerBytes(context.Background(), tn, []string{layer})
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

func checkpointIDs(t *testing.T, m *Manager) []string {
	t.Helper()
	cks, err := m.ListCheckpoints(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range cks {
		ids = append(ids, c.ID)
	}
	return ids
}

// Every checkpoint and saved template version is admitted against its
// tenant's disk quota once written and before it is recorded; a refused
// one leaves no record and no layer. LayerBytes charges a tenant its own
// checkpoints and templates, not the catalogue's layers nor another
// tenant's.
func TestLayerAdmission(t *testing.T) {
	m, q, base := layerManager(t)
	ctx := context.Background()
	acme := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "acme", Scope: api.ScopeFull})
	id := createOn(t, m, "acme", base)
	other := createOn(t, m, "other", base)
	writeUpper(t, m, id, "one", 1<<17)
	writeUpper(t, m, other, "zzz", 1<<15)

	ck, err := m.CreateCheckpoint(acme, id, api.CreateCheckpointRequest{Name: "one"})
	if err != nil {
		t.Fatal(err)
	}
	asked, released := q.Calls()
	if want := []string{"acme " + ck.Layers[0]}; !slices.Equal(asked, want) {
		t.Fatalf("admission asked %v, want %v", asked, want)
	}
	if want := []string{ck.Layers[0] + " recorded=true"}; !slices.Equal(released, want) {
		t.Fatalf("released %v, want %v (after the record)", released, want)
	}
	if _, err := m.CreateCheckpoint(ctx, other, api.CreateCheckpointRequest{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.LayerBytes(ctx, "acme", nil); got != ck.SizeBytes || base.Size == 0 {
		t.Fatalf("acme's layer bytes %d, want its checkpoint's %d (not the catalogue's base)", got, ck.SizeBytes)
	}

	// A saved template version is the tenant's too.
	writeUpper(t, m, id, "two", 1<<16)
	q.Reset(false)
	v, err := m.SaveTemplate(acme, id, api.SaveTemplateRequest{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if asked, released := q.Calls(); len(asked) != 1 || asked[0] != "acme "+v.ID || len(released) != 1 || released[0] != v.ID+" recorded=true" {
		t.Fatalf("save: asked %v, released %v", asked, released)
	}
	vl, err := m.cfg.Layers.Get(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := m.LayerBytes(ctx, "acme", nil); got != ck.SizeBytes+vl.Size {
		t.Fatalf("acme's layer bytes %d, want checkpoint %d + template %d", got, ck.SizeBytes, vl.Size)
	}

	// Refused: checkpoint, implicit checkpoints (fork, exec transaction),
	// template save. Nothing is left of any.
	writeUpper(t, m, id, "three", 1<<16)
	q.Reset(true)
	cksBefore, dirsBefore := checkpointIDs(t, m), layerDirs(t, m)
	_, err = m.CreateCheckpoint(acme, id, api.CreateCheckpointRequest{Name: "three"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("checkpoint over quota: %v", err)
	}
	if _, err := m.ForkSandbox(acme, id, api.ForkRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("fork over quota: %v", err)
	}
	if _, err := m.Exec(acme, id, api.ExecRequest{Cmd: []string{"true"}, CheckpointBefore: true}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("exec with checkpoint_before over quota: %v", err)
	}
	if _, err := m.SaveTemplate(acme, id, api.SaveTemplateRequest{Name: "app"}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("template save over quota: %v", err)
	}
	if asked, _ := q.Calls(); len(asked) != 4 {
		t.Errorf("admission asked %d times, want 4: %v", len(asked), asked)
	}
	if got := checkpointIDs(t, m); !slices.Equal(got, cksBefore) {
		t.Errorf("checkpoints %v after refusals, want %v", got, cksBefore)
	}
	if got := layerDirs(t, m); !slices.Equal(got, dirsBefore) {
		t.Errorf("layer store %v after refusals, want %v", got, dirsBefore)
	}
	if vs, err := m.TemplateVersions(acme, "app"); err != nil || len(vs) != 1 {
		t.Errorf("template versions after a refused save: %d, %v", len(vs), err)
	}
	if n, _ := m.Holdings("acme"); n != 1 {
		t.Errorf("acme holds %d sandboxes after a refused fork, want 1", n)
	}

	// Deleting the checkpoint frees its layer.
	q.Reset(false)
	rc, err := m.ExportCheckpoint(acme, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteCheckpoint(acme, ck.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.LayerBytes(ctx, "acme", nil); got != vl.Size {
		t.Errorf("acme's layer bytes after deleting its checkpoint: %d, want %d", got, vl.Size)
	}
	// Extra layers are charged once however often they are named.
	if got, _ := m.LayerBytes(ctx, "acme", []string{ck.Layers[1], v.ID, v.ID}); got != vl.Size {
		t.Errorf("extra catalogue and held layers changed the charge: %d, want %d", got, vl.Size)
	}

	// An import over quota removes the layers it wrote (here the deleted
	// checkpoint's, on the catalogue's base, which stays).
	q.Reset(true)
	dirsBefore = layerDirs(t, m)
	if _, err := m.ImportTemplate(acme, "img", bytes.NewReader(archive)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("import over quota: %v", err)
	}
	if got := layerDirs(t, m); !slices.Equal(got, dirsBefore) {
		t.Errorf("layer store %v after a refused import, want %v", got, dirsBefore)
	}
	if _, err := m.GetTemplate(acme, "img"); !errdefs.IsNotFound(err) {
		t.Errorf("refused import registered: %v", err)
	}
	q.Reset(false)
	img, err := m.ImportTemplate(acme, "img", bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if asked, _ := q.Calls(); !slices.Equal(asked, []string{"acme " + img.ID}) {
		t.Errorf("import asked %v", asked)
	}
	if got, _ := m.LayerBytes(ctx, "acme", nil); got != vl.Size+ck.SizeBytes {
		t.Errorf("acme's layer bytes with its import: %d, want %d", got, vl.Size+ck.SizeBytes)
	}
	if _, err := m.cfg.Layers.Get(base.ID); err != nil {
		t.Errorf("catalogue base after the imports: %v", err)
	}
}
