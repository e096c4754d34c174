package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/snapshot"
	"github.com/agentbox/agentbox/internal/templatesvc"
	"github.com/agentbox/agentbox/internal/tenant"
)

// The checkpoint feature on a test Manager (layerquota_export_test.go).
func snapshots(t *testing.T, m *sandbox.Manager, q sandbox.Quotas) *snapshot.Snapshots {
	t.Helper()
	s := snapshot.New(snapshot.Config{Layers: sandbox.LayersOf(m), Checkpoints: sandbox.CheckpointStoreOf(m), IDs: sandbox.IDsOf(m), Quotas: q})
	if err := s.Provision(m); err != nil {
		t.Fatal(err)
	}
	return s
}

func checkpointIDs(t *testing.T, s *snapshot.Snapshots) []string {
	t.Helper()
	cks, err := s.ListCheckpoints(context.Background(), "")
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
	m, q, base := sandbox.LayerManager(t)
	s := snapshots(t, m, q)
	ts := templatesvc.New(templatesvc.Config{Templates: sandbox.TemplatesOf(m), Layers: sandbox.LayersOf(m), Sandboxes: m})
	ctx := context.Background()
	acme := tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "acme", Scope: api.ScopeFull})
	id := sandbox.CreateOn(t, m, "acme", base)
	other := sandbox.CreateOn(t, m, "other", base)
	sandbox.WriteUpper(t, m, id, "one", 1<<17)
	sandbox.WriteUpper(t, m, other, "zzz", 1<<15)

	ck, err := s.CreateCheckpoint(acme, id, api.CreateCheckpointRequest{Name: "one"})
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
	if _, err := s.CreateCheckpoint(ctx, other, api.CreateCheckpointRequest{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := sandbox.LayerBytes(ctx, m, "acme", nil); got != ck.SizeBytes || base.Size == 0 {
		t.Fatalf("acme's layer bytes %d, want its checkpoint's %d (not the catalogue's base)", got, ck.SizeBytes)
	}

	// A saved template version is the tenant's too.
	sandbox.WriteUpper(t, m, id, "two", 1<<16)
	q.Reset(false)
	v, err := ts.SaveTemplate(acme, id, api.SaveTemplateRequest{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if asked, released := q.Calls(); len(asked) != 1 || asked[0] != "acme "+v.ID || len(released) != 1 || released[0] != v.ID+" recorded=true" {
		t.Fatalf("save: asked %v, released %v", asked, released)
	}
	vl, err := sandbox.LayersOf(m).Get(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := sandbox.LayerBytes(ctx, m, "acme", nil); got != ck.SizeBytes+vl.Size {
		t.Fatalf("acme's layer bytes %d, want checkpoint %d + template %d", got, ck.SizeBytes, vl.Size)
	}

	// Refused: checkpoint, implicit checkpoints (fork, exec transaction),
	// template save. Nothing is left of any.
	sandbox.WriteUpper(t, m, id, "three", 1<<16)
	q.Reset(true)
	cksBefore, dirsBefore := checkpointIDs(t, s), sandbox.LayerDirs(t, m)
	_, err = s.CreateCheckpoint(acme, id, api.CreateCheckpointRequest{Name: "three"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("checkpoint over quota: %v", err)
	}
	if _, err := s.ForkSandbox(acme, id, api.ForkRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("fork over quota: %v", err)
	}
	if _, err := s.Exec(acme, id, api.ExecRequest{Cmd: []string{"true"}, CheckpointBefore: true}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("exec with checkpoint_before over quota: %v", err)
	}
	if _, err := ts.SaveTemplate(acme, id, api.SaveTemplateRequest{Name: "app"}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("template save over quota: %v", err)
	}
	if asked, _ := q.Calls(); len(asked) != 4 {
		t.Errorf("admission asked %d times, want 4: %v", len(asked), asked)
	}
	if got := checkpointIDs(t, s); !slices.Equal(got, cksBefore) {
		t.Errorf("checkpoints %v after refusals, want %v", got, cksBefore)
	}
	if got := sandbox.LayerDirs(t, m); !slices.Equal(got, dirsBefore) {
		t.Errorf("layer store %v after refusals, want %v", got, dirsBefore)
	}
	if vs, err := ts.TemplateVersions(acme, "app"); err != nil || len(vs) != 1 {
		t.Errorf("template versions after a refused save: %d, %v", len(vs), err)
	}
	if n, _ := m.Holdings("acme"); n != 1 {
		t.Errorf("acme holds %d sandboxes after a refused fork, want 1", n)
	}

	// Deleting the checkpoint frees its layer.
	q.Reset(false)
	rc, err := s.ExportCheckpoint(acme, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCheckpoint(acme, ck.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := sandbox.LayerBytes(ctx, m, "acme", nil); got != vl.Size {
		t.Errorf("acme's layer bytes after deleting its checkpoint: %d, want %d", got, vl.Size)
	}
	// Extra layers are charged once however often they are named.
	if got, _ := sandbox.LayerBytes(ctx, m, "acme", []string{ck.Layers[1], v.ID, v.ID}); got != vl.Size {
		t.Errorf("extra catalogue and held layers changed the charge: %d, want %d", got, vl.Size)
	}

	// An import over quota removes the layers it wrote (here the deleted
	// checkpoint's, on the catalogue's base, which stays).
	q.Reset(true)
	dirsBefore = sandbox.LayerDirs(t, m)
	if _, err := ts.ImportTemplate(acme, "img", bytes.NewReader(archive)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("import over quota: %v", err)
	}
	if got := sandbox.LayerDirs(t, m); !slices.Equal(got, dirsBefore) {
		t.Errorf("layer store %v after a refused import, want %v", got, dirsBefore)
	}
	if _, err := ts.GetTemplate(acme, "img"); !errdefs.IsNotFound(err) {
		t.Errorf("refused import registered: %v", err)
	}
	q.Reset(false)
	img, err := ts.ImportTemplate(acme, "img", bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if asked, _ := q.Calls(); !slices.Equal(asked, []string{"acme " + img.ID}) {
		t.Errorf("import asked %v", asked)
	}
	if got, _ := sandbox.LayerBytes(ctx, m, "acme", nil); got != vl.Size+ck.SizeBytes {
		t.Errorf("acme's layer bytes with its import: %d, want %d", got, vl.Size+ck.SizeBytes)
	}
	if _, err := sandbox.LayersOf(m).Get(base.ID); err != nil {
		t.Errorf("catalogue base after the imports: %v", err)
	}
}
