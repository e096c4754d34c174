package sandbox

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/templates"
	"github.com/agentbox/agentbox/internal/tenant"
)

// TestHiddenSandboxLifecycle drives the core's API for warm pools: a
// hidden sandbox is invisible until handed out, then an ordinary sandbox
// whose transition log starts at its hand-out.
func TestHiddenSandboxLifecycle(t *testing.T) {
	m, _, be := newTestManager(t)
	ctx := context.Background()
	tmpl := templates.Template{Name: "tpl", ID: "tpl-1", Layers: []string{t.TempDir()}, Env: map[string]string{"A": "tmpl", "B": "tmpl"}}

	if _, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl, "", nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create hidden without a holder: %v", err)
	}
	var setupRan bool
	h, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl, "tpl", func(ctx context.Context, h *Handle) error {
		setupRan = h.Live() && !be.get(h.ID()).isPaused()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !setupRan {
		t.Fatal("set-up did not run on the running sandbox")
	}
	id := h.ID()
	if _, err := m.GetSandbox(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("get hidden: %v, want not found", err)
	}
	if _, err := m.Handle(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("handle of hidden: %v, want not found", err)
	}
	if l, err := m.ListSandboxes(ctx, nil); err != nil || len(l) != 0 {
		t.Fatalf("list with only a hidden sandbox: %v, %v", l, err)
	}
	if n, _ := m.Holdings(tenant.Admin.Tenant); n != 0 {
		t.Fatalf("holdings count a hidden sandbox: %d", n)
	}
	if !be.get(id).isPaused() {
		t.Fatal("hidden sandbox not frozen after its set-up")
	}

	other := tmpl
	other.ID = "tpl-2"
	if _, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl"}, other); !errdefs.IsConflict(err) {
		t.Fatalf("hand out to another template version: %v, want conflict", err)
	}
	sb, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl", Env: map[string]string{"B": "req"}, Labels: map[string]string{"k": "v"}}, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != id || sb.State != api.StateRunning || sb.Env["A"] != "tmpl" || sb.Env["B"] != "req" || sb.Labels["k"] != "v" {
		t.Fatalf("handed out: %+v", sb)
	}
	if be.get(id).isPaused() {
		t.Fatal("handed out still frozen")
	}
	if got := state(t, m, id); got != api.StateRunning {
		t.Fatalf("state %s", got)
	}
	ts, err := transitions(ctx, m, id)
	if err != nil || len(ts) != 1 || ts[0].From != api.StateCreating || ts[0].Cause != api.CauseCreate || ts[0].Detail != "warm pool" {
		t.Fatalf("transitions %+v, %v", ts, err)
	}
	if l, err := m.ListSandboxes(ctx, nil); err != nil || len(l) != 1 {
		t.Fatalf("list after hand-out: %v, %v", l, err)
	}
	if n, _ := m.Holdings(tenant.Admin.Tenant); n != 1 {
		t.Fatalf("holdings after hand-out: %d, want 1", n)
	}

	// Handed out, it is no longer the holder's.
	if _, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl"}, tmpl); !errdefs.IsNotFound(err) {
		t.Fatalf("second hand-out: %v, want not found", err)
	}
	if err := m.DeleteHidden(ctx, h); !errdefs.IsNotFound(err) {
		t.Fatalf("delete hidden of a handed-out sandbox: %v, want not found", err)
	}
	if got := state(t, m, id); got != api.StateRunning {
		t.Fatalf("state after refused hidden calls %s", got)
	}
}

func TestDeleteHidden(t *testing.T) {
	m, _, be := newTestManager(t)
	ctx := context.Background()
	tmpl := templates.Template{Name: "tpl", ID: "tpl-1", Layers: []string{t.TempDir()}}
	h, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl, "tpl", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteHidden(ctx, h); err != nil {
		t.Fatal(err)
	}
	if !be.get(h.ID()).isDestroyed() {
		t.Fatal("deleted hidden sandbox's guest not destroyed")
	}
	if err := m.DeleteHidden(ctx, h); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v, want not found", err)
	}
	if _, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl"}, tmpl); !errdefs.IsNotFound(err) {
		t.Fatalf("hand out a deleted sandbox: %v, want not found", err)
	}
}

func TestCreateHiddenSetupFails(t *testing.T) {
	m, _, be := newTestManager(t)
	ctx := context.Background()
	tmpl := templates.Template{Name: "tpl", ID: "tpl-1", Layers: []string{t.TempDir()}}
	var id string
	boom := errors.New("boom")
	_, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl, "tpl", func(ctx context.Context, h *Handle) error {
		id = h.ID()
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("create hidden with a failing set-up: %v", err)
	}
	if !be.get(id).isDestroyed() {
		t.Fatal("sandbox of a failed set-up left running")
	}
	m.mu.Lock()
	_, left := m.sandboxes[id]
	m.mu.Unlock()
	if left {
		t.Fatal("sandbox of a failed set-up left in the table")
	}
	if _, err := os.Stat(m.paths(id).dir); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir of a failed set-up: %v", err)
	}
}

// interceptExt supplies every create from its one hidden sandbox.
type interceptExt struct {
	core HiddenCore
	h    *Handle
	asks int
}

func (e *interceptExt) Name() string { return "intercept" }

func (e *interceptExt) Provision(c Core) error {
	e.core = c.(HiddenCore)
	return nil
}

func (e *interceptExt) InterceptCreate(ctx context.Context, req api.CreateSandboxRequest, tmpl templates.Template) (api.Sandbox, bool) {
	e.asks++
	if e.h == nil {
		return api.Sandbox{}, false
	}
	sb, err := e.core.HandOut(ctx, e.h, req, tmpl)
	e.h = nil
	return sb, err == nil
}

func TestCollectHooksFindsInterceptor(t *testing.T) {
	e := &interceptExt{}
	hs, err := collectHooks([]Extension{e})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs.intercept) != 1 {
		t.Fatalf("interceptors %d, want 1", len(hs.intercept))
	}
}

func TestInterceptSuppliesCreate(t *testing.T) {
	m, _, _ := newTestManager(t)
	e := &interceptExt{core: m}
	m.hooks.intercept = []namedHook[CreateInterceptor]{{e.Name(), e}}
	ctx := context.Background()
	tmpl := templates.Template{Name: "tpl", ID: "tpl-1", Layers: []string{t.TempDir()}}
	if _, ok := m.intercept(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl); ok {
		t.Fatal("an interceptor with nothing supplied a sandbox")
	}
	h, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl"}, tmpl, "tpl", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	sb, ok := m.intercept(ctx, api.CreateSandboxRequest{Template: "tpl", Name: "n"}, tmpl)
	if !ok || sb.ID != h.ID() || sb.Name != "n" {
		t.Fatalf("intercepted create: %+v, %v", sb, ok)
	}
	if e.asks != 2 {
		t.Fatalf("interceptor asked %d times, want 2", e.asks)
	}
}

// TestHiddenSandboxBackend: a hidden sandbox runs on the backend its
// request names, and HandOut gives it only to a create that runs there: a
// create for another backend (or the default, when it is another) is
// refused, and the sandbox stays hidden for a create that matches.
func TestHiddenSandboxBackend(t *testing.T) {
	e := newBackendEnv(t)
	native, gv := newNamedBackend(t, "native"), newNamedBackend(t, "gvisor")
	m := e.manager(t, native, gv)
	ctx := context.Background()
	tmpl := templates.Template{Name: "tpl", ID: "tpl-1", Layers: []string{t.TempDir()}}

	for _, c := range []struct{ template, asked, want string }{{"", "", "native"}, {"tpl", "", "native"}, {"tpl", "gvisor", "gvisor"}, {"tpl", "native", "native"}} {
		if got, err := m.ResolveRuntime(ctx, c.template, c.asked); err != nil || got != c.want {
			t.Errorf("ResolveRuntime(%q, %q) = %q, %v; want %q", c.template, c.asked, got, err, c.want)
		}
	}
	if _, err := m.ResolveRuntime(ctx, "tpl", "nope"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ResolveRuntime of an unknown backend: %v", err)
	}

	h, err := m.CreateHidden(ctx, api.CreateSandboxRequest{Template: "tpl", Runtime: "gvisor"}, tmpl, "tpl:gvisor", nil)
	if err != nil {
		t.Fatal(err)
	}
	if gv.creates() != 1 || native.creates() != 0 || recordedBackend(t, e.st, h.ID()) != "gvisor" {
		t.Fatalf("hidden sandbox on gvisor: creates native %d gvisor %d, record %q", native.creates(), gv.creates(), recordedBackend(t, e.st, h.ID()))
	}
	for _, rt := range []string{"native", ""} {
		if sb, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl", Runtime: rt}, tmpl); !errdefs.IsConflict(err) {
			t.Fatalf("hand out a gvisor sandbox to a create for %q: %+v, %v; want conflict", rt, sb, err)
		}
	}
	if _, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl", Runtime: "nope"}, tmpl); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("hand out to a create for an unknown backend: %v", err)
	}
	if _, err := m.GetSandbox(ctx, h.ID()); !errdefs.IsNotFound(err) {
		t.Fatalf("a refused hand-out made the sandbox visible: %v", err)
	}
	sb, err := m.HandOut(ctx, h, api.CreateSandboxRequest{Template: "tpl", Runtime: "gvisor"}, tmpl)
	if err != nil || sb.Backend != "gvisor" || sb.State != api.StateRunning {
		t.Fatalf("hand out to a create for gvisor: %+v, %v", sb, err)
	}
}
