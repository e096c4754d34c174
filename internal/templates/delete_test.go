package templates

import (
	"context"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Delete forgets a tenant's built and saved templates under their stored
// names and drops every layer reference they held; a new template of the
// same name starts from nothing, and other names are untouched.
func TestDeleteTemplate(t *testing.T) {
	m, _ := newManager(t, &fakeRunner{})
	ctx := context.Background()
	spec := api.TemplateSpec{Name: "acme~app", Base: "busybox", Steps: []api.TemplateStep{{Run: "write /a one"}}}
	built, _ := build(t, m, api.BuildTemplateRequest{Spec: &spec})
	other := api.TemplateSpec{Name: "beta~app", Base: "busybox", Steps: []api.TemplateStep{{Run: "write /a two"}}}
	build(t, m, api.BuildTemplateRequest{Spec: &other})
	if _, err := m.Save(ctx, "acme~saved", built.ID, nil, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Save(ctx, "acme~saved", built.ID, nil, "test"); err != nil {
		t.Fatal(err)
	}
	if got := m.Names(); !slices.Contains(got, "acme~app") || !slices.Contains(got, "acme~saved") || !slices.Contains(got, "beta~app") {
		t.Fatalf("Names() = %v", got)
	}
	for _, n := range []string{"acme~app", "acme~saved"} {
		if err := m.Delete(ctx, n); err != nil {
			t.Fatalf("Delete(%s): %v", n, err)
		}
		if _, err := m.Get(ctx, n); !errdefs.IsNotFound(err) {
			t.Errorf("Get(%s) after Delete: %v", n, err)
		}
		if err := m.Delete(ctx, n); err != nil {
			t.Errorf("second Delete(%s): %v", n, err)
		}
	}
	if refs := refsOf(t, m, built.ID); len(refs) != 0 {
		t.Errorf("the deleted templates' layer keeps references %v", refs)
	}
	if got := m.Names(); slices.Contains(got, "acme~app") || slices.Contains(got, "acme~saved") || !slices.Contains(got, "beta~app") {
		t.Errorf("Names() after Delete = %v", got)
	}
	if _, err := m.Get(ctx, "beta~app"); err != nil {
		t.Errorf("another tenant's template: %v", err)
	}
	if vs, err := m.Versions(ctx, "acme~saved"); !errdefs.IsNotFound(err) {
		t.Errorf("versions of the deleted saved template: %v %v", vs, err)
	}
	// Saved again under the same name, it starts at version 1.
	v, err := m.Save(ctx, "acme~saved", built.ID, nil, "test")
	if err != nil || v.Version != 1 {
		t.Errorf("saving a deleted name again: %+v %v", v, err)
	}
	// Builtins are not deleted.
	if err := m.Delete(ctx, "busybox"); err != nil {
		t.Errorf("Delete(busybox): %v", err)
	}
}
