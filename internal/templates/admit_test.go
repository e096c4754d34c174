package templates

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// refsOf returns the template references on layer id.
func refsOf(t *testing.T, m *Manager, id string) []string {
	t.Helper()
	l, err := m.cfg.Layers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range l.Refs {
		if _, ok := RefTemplate(r); ok {
			out = append(out, r)
		}
	}
	return out
}

// A new layer a template takes (build, import, saved version) is admitted
// once its reference is taken and before the record is written; a refused
// one registers nothing and drops the reference. A rebuild to the layer the
// template holds already is not asked about.
func TestAdmitTemplateLayers(t *testing.T) {
	m, _ := newManager(t, &fakeRunner{})
	f := newFakeAdmit(m)
	m.cfg.Admit = func(ctx context.Context, name, layer string) (func(), error) { return f.Admit(name, layer) }
	ctx := context.Background()

	spec := api.TemplateSpec{Name: "acme~app", Base: "busybox", Steps: []api.TemplateStep{{Run: "write /a one"}}}
	f.Reset(true)
	_, err := m.Build(ctx, api.BuildTemplateRequest{Spec: &spec}, nil)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("refused build: %v", err)
	}
	if _, err := m.Get(ctx, "acme~app"); !errdefs.IsNotFound(err) {
		t.Fatalf("a refused build registered its template: %v", err)
	}
	calls, _ := f.Calls()
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "acme~app ") {
		t.Fatalf("admission calls %v", calls)
	}
	refused := strings.TrimPrefix(calls[0], "acme~app ")
	if refs := refsOf(t, m, refused); len(refs) != 0 {
		t.Fatalf("refused layer keeps references %v", refs)
	}

	f.Reset(false)
	tmpl, _ := build(t, m, api.BuildTemplateRequest{Spec: &spec})
	calls, released := f.Calls()
	if want := []string{"acme~app " + tmpl.ID}; !slices.Equal(calls, want) {
		t.Fatalf("admission calls %v, want %v", calls, want)
	}
	// busybox, built on the way as the base, is no template: only the
	// steps' result was asked about.
	if want := []string{"acme~app recorded=true"}; !slices.Equal(released, want) {
		t.Fatalf("released %v, want %v", released, want)
	}

	// The same result again: nothing new to admit, even over quota.
	f.Reset(true)
	if again, _ := build(t, m, api.BuildTemplateRequest{Spec: &spec, Force: true}); again.ID != tmpl.ID {
		t.Fatalf("forced rebuild gave %s, want %s", again.ID, tmpl.ID)
	}
	if calls, _ := f.Calls(); len(calls) != 0 {
		t.Fatalf("rebuild to the held layer asked %v", calls)
	}
	// A changed spec over quota: refused, the old build stays.
	spec.Steps[0].Run = "write /a two"
	if _, err := m.Build(ctx, api.BuildTemplateRequest{Spec: &spec}, nil); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("refused rebuild: %v", err)
	}
	if got, err := m.Get(ctx, "acme~app"); err != nil || got.ID != tmpl.ID {
		t.Fatalf("after a refused rebuild the template is %s, %v; want %s", got.ID, err, tmpl.ID)
	}
	if refs := refsOf(t, m, tmpl.ID); !slices.Equal(refs, []string{builtRef("acme~app")}) {
		t.Fatalf("old build's references %v", refs)
	}

	// Import (Adopt) and saved versions go through the same admission.
	if _, err := m.Adopt(ctx, "acme~img", tmpl.ID, nil); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("refused import: %v", err)
	}
	if _, err := m.Get(ctx, "acme~img"); !errdefs.IsNotFound(err) {
		t.Fatalf("refused import registered: %v", err)
	}
	if _, err := m.Save(ctx, "acme~saved", tmpl.ID, nil, "sb1"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("refused save: %v", err)
	}
	if _, err := m.Versions(ctx, "acme~saved"); !errdefs.IsNotFound(err) {
		t.Fatalf("refused save left versions: %v", err)
	}
	if refs := refsOf(t, m, tmpl.ID); !slices.Equal(refs, []string{builtRef("acme~app")}) {
		t.Fatalf("refused import and save left references %v", refs)
	}
	if calls, _ := f.Calls(); len(calls) != 3 {
		t.Fatalf("admission calls %v, want the rebuild, the import and the save", calls)
	}
	f.Reset(false)
	v, err := m.Save(ctx, "acme~saved", tmpl.ID, nil, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if calls, released := f.Calls(); !slices.Equal(calls, []string{"acme~saved " + tmpl.ID}) || !slices.Equal(released, []string{"acme~saved recorded=true"}) {
		t.Fatalf("save: calls %v, released %v", calls, released)
	}
	if name, ok := RefTemplate(versionRef("acme~saved", v.Version)); !ok || name != "acme~saved" {
		t.Errorf("RefTemplate(version ref) = %q, %v", name, ok)
	}
	if _, ok := RefTemplate("checkpoint/abc"); ok {
		t.Error("RefTemplate took a checkpoint's reference")
	}
}

// newFakeAdmit records template layer admissions; "recorded" is whether
// the template's record exists at release.
func newFakeAdmit(m *Manager) *testutil.AdmitRecorder {
	return &testutil.AdmitRecorder{
		Recorded: func(name, _ string) bool { _, err := m.Get(context.Background(), name); return err == nil },
		Label:    func(name, _ string) string { return name },
	}
}
