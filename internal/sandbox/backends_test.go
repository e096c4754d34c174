package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock/clocktest"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// registryOf is the registry of bs, the first the default.
func registryOf(t testing.TB, bs ...runtime.Backend) *runtime.Registry {
	t.Helper()
	r, err := runtime.NewRegistry("", bs...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// namedBackend is a fakeBackend under another name whose Recover re-adopts
// what its Create made (a fake guest is its listener: the old one is
// closed and a new one made), recording the ids.
type namedBackend struct {
	*fakeBackend
	name string

	// mu guards the fields below.
	mu        sync.Mutex
	recovered []string
	cleaned   []string
}

func newNamedBackend(t *testing.T, name string) *namedBackend {
	return &namedBackend{fakeBackend: &fakeBackend{guestPath: sharedGuest(t), live: map[string]*fakeSandbox{}}, name: name}
}

func (n *namedBackend) Capabilities() runtime.Capabilities {
	c := n.fakeBackend.Capabilities()
	c.Name = n.name
	return c
}

func (n *namedBackend) Recover(ctx context.Context, spec runtime.Spec, _ []byte) (runtime.Sandbox, error) {
	if old := n.get(spec.ID); old != nil {
		// Its listener only: the earlier manager, closed, still watches
		// its Wait channel, and the guest did not exit.
		old.ln.Close()
		_ = os.Remove(spec.SocketPath)
	}
	n.mu.Lock()
	n.recovered = append(n.recovered, spec.ID)
	n.mu.Unlock()
	return n.Create(ctx, spec)
}

func (n *namedBackend) Cleanup(ctx context.Context, spec runtime.Spec) error {
	n.mu.Lock()
	n.cleaned = append(n.cleaned, spec.ID)
	n.mu.Unlock()
	return nil
}

func (n *namedBackend) creates() int {
	n.fakeBackend.mu.Lock()
	defer n.fakeBackend.mu.Unlock()
	return n.created
}

func (n *namedBackend) calls() (recovered, cleaned []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.recovered), slices.Clone(n.cleaned)
}

// backendEnv is a store and directories managers of one "daemon" share
// across restarts.
type backendEnv struct {
	st                      *store.Bolt
	dataDir, runDir, runner string
}

func newBackendEnv(t *testing.T) backendEnv {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	runDir, err := os.MkdirTemp("", "abxb") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	return backendEnv{st: st, dataDir: filepath.Join(dir, "data"), runDir: runDir, runner: filepath.Join(dir, "runner")}
}

func (e backendEnv) manager(t *testing.T, backends ...runtime.Backend) *Manager {
	t.Helper()
	m, err := New(Config{
		DataDir: e.dataDir, RunDir: e.runDir, RunnerDir: e.runner,
		IDs:   runtime.IDMap{HostID: uint32(os.Getuid()), Size: 1},
		Clock: clocktest.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
	}, registryOf(t, backends...), nil, e.st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// startOn starts a sandbox as createTest does, its record naming backend
// ("": none, as records of old daemons might).
func startOn(t *testing.T, m *Manager, backend string) string {
	t.Helper()
	id := newID()
	p := m.paths(id)
	sb := api.Sandbox{ID: id, State: api.StateCreating, Hostname: id, CreatedAt: m.cfg.Clock.Now(), Backend: backend, Lifecycle: api.LifecycleSession}
	rec := store.SandboxRecord{Sandbox: sb, Layers: []string{t.TempDir()}, UpperDir: p.upper, WorkDir: p.work, SocketPath: p.socket, StateDir: p.state}
	if _, err := m.start(context.Background(), rec, true); err != nil {
		t.Fatal(err)
	}
	return id
}

func recordedBackend(t *testing.T, st store.Store, id string) string {
	t.Helper()
	rec, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Sandbox.Backend
}

// TestBackendPerSandbox: each sandbox runs on, and its record names, the
// backend it was created on (a record naming none: the default, when no
// native backend runs); a restarted manager re-adopts each on the backend
// its record names; one whose backend the new manager does not run is
// left alone: not reaped, not cleaned up, not served.
func TestBackendPerSandbox(t *testing.T) {
	e := newBackendEnv(t)
	a, b := newNamedBackend(t, "alpha"), newNamedBackend(t, "beta")
	m := e.manager(t, a, b)

	onDefault := startOn(t, m, "")
	onBeta := startOn(t, m, "beta")
	if na, nb := a.creates(), b.creates(); na != 1 || nb != 1 {
		t.Fatalf("creates: alpha %d, beta %d; want 1 each", na, nb)
	}
	for id, want := range map[string]string{onDefault: "alpha", onBeta: "beta"} {
		if got := recordedBackend(t, e.st, id); got != want {
			t.Errorf("record of %s names backend %q, want %q", id, got, want)
		}
		sb, err := m.GetSandbox(context.Background(), id)
		if err != nil || sb.Backend != want {
			t.Errorf("GetSandbox(%s) = backend %q, %v; want %q", id, sb.Backend, err, want)
		}
	}
	m.Close()

	// A restart with both backends: each sandbox goes back to its own.
	a2, b2 := newNamedBackend(t, "alpha"), newNamedBackend(t, "beta")
	a2.fakeBackend.live, b2.fakeBackend.live = a.live, b.live
	m2 := e.manager(t, b2, a2) // another order, another default: records decide
	if err := m2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	ra, ca := a2.calls()
	rb, cb := b2.calls()
	if !slices.Equal(ra, []string{onDefault}) || !slices.Equal(rb, []string{onBeta}) || len(ca)+len(cb) != 0 {
		t.Fatalf("recovered alpha %v beta %v, cleaned alpha %v beta %v; want alpha [%s] beta [%s], none cleaned", ra, rb, ca, cb, onDefault, onBeta)
	}
	for _, id := range []string{onDefault, onBeta} {
		if sb, err := m2.GetSandbox(context.Background(), id); err != nil || sb.State != api.StateRunning {
			t.Errorf("after recovery %s: %+v, %v", id, sb, err)
		}
	}
	m2.Close()

	// A restart without beta: its sandbox is left as it is.
	a3 := newNamedBackend(t, "alpha")
	a3.fakeBackend.live = a2.live
	m3 := e.manager(t, a3)
	if err := m3.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ra, ca := a3.calls(); !slices.Equal(ra, []string{onDefault}) || len(ca) != 0 {
		t.Fatalf("alpha recovered %v cleaned %v; want [%s], none", ra, ca, onDefault)
	}
	if _, err := m3.GetSandbox(context.Background(), onBeta); !errdefs.IsNotFound(err) {
		t.Errorf("sandbox of a backend not run is served: %v", err)
	}
	if got := recordedBackend(t, e.st, onBeta); got != "beta" {
		t.Errorf("record of the beta sandbox: backend %q", got)
	}
	if _, err := os.Stat(m3.paths(onBeta).dir); err != nil {
		t.Errorf("directory of the beta sandbox: %v", err)
	}
}

// TestCreateUnknownRuntime: a create naming a backend the daemon does not
// run is ErrInvalidArgument, naming the backends there are; nothing is
// created.
func TestCreateUnknownRuntime(t *testing.T) {
	e := newBackendEnv(t)
	a := newNamedBackend(t, "alpha")
	m := e.manager(t, a)
	_, err := m.CreateSandbox(context.Background(), api.CreateSandboxRequest{Runtime: "nosuch"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create on runtime nosuch: %v, want invalid argument", err)
	}
	if want := `runtime "nosuch": no such backend (this daemon runs alpha)`; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if n := a.creates(); n != 0 {
		t.Errorf("%d sandboxes created", n)
	}
}

// TestInfoBackends: Info describes the default backend and lists every
// one, the default first.
func TestInfoBackends(t *testing.T) {
	e := newBackendEnv(t)
	m := e.manager(t, newNamedBackend(t, "alpha"), newNamedBackend(t, "beta"))
	info, err := m.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Backend != "alpha" || len(info.Backends) != 2 ||
		info.Backends[0].Name != "alpha" || !info.Backends[0].Default ||
		info.Backends[1].Name != "beta" || info.Backends[1].Default ||
		!slices.Contains(info.Backends[1].Capabilities, runtime.CapPause) {
		t.Fatalf("info: backend %q, backends %+v", info.Backend, info.Backends)
	}
}

// TestRecordWithoutBackendIsNative: a record that names no backend (as
// none did before backends were chosen by configuration) is native's,
// whatever the default.
func TestRecordWithoutBackendIsNative(t *testing.T) {
	e := newBackendEnv(t)
	alpha, native := newNamedBackend(t, "alpha"), newNamedBackend(t, "native")
	m := e.manager(t, alpha, native)
	id := startOn(t, m, "")
	if na, nn := alpha.creates(), native.creates(); na != 0 || nn != 1 {
		t.Fatalf("creates: alpha (the default) %d, native %d; want native's", na, nn)
	}
	if got := recordedBackend(t, e.st, id); got != "native" {
		t.Errorf("record names backend %q, want native", got)
	}
}

// TestCreateByNameRuntime: creating an existing name returns that sandbox
// unless the request names another runtime than the sandbox runs on
// (ErrConflict, as for another template).
func TestCreateByNameRuntime(t *testing.T) {
	e := newBackendEnv(t)
	m := e.manager(t, newNamedBackend(t, "alpha"), newNamedBackend(t, "beta"))
	id := createTest(t, m, api.CreateSandboxRequest{Name: "named"})
	ctx := context.Background()
	for _, rt := range []string{"", "alpha"} {
		sb, created, err := m.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "named", Runtime: rt})
		if err != nil || created || sb.ID != id {
			t.Errorf("create by name, runtime %q: %s created %v, %v; want %s", rt, sb.ID, created, err, id)
		}
	}
	if _, _, err := m.CreateOrGetSandbox(ctx, api.CreateSandboxRequest{Name: "named", Runtime: "beta"}); !errdefs.IsConflict(err) {
		t.Errorf("create by name on another runtime: %v, want conflict", err)
	}
}
