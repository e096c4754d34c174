package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock/clocktest"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// --- a fake backend whose guests are the real guest server ---

// TestMain removes the shared guest's socket dir, which outlives every test.
func TestMain(m *testing.M) {
	code := m.Run()
	if sharedGuestPath != "" {
		os.RemoveAll(filepath.Dir(sharedGuestPath))
	}
	os.Exit(code)
}

// One guest.Serve per process: every fake sandbox's socket is proxied to it.
var (
	sharedGuestOnce sync.Once
	sharedGuestPath string
	sharedGuestErr  error
)

func sharedGuest(t *testing.T) string {
	sharedGuestOnce.Do(func() {
		dir, err := os.MkdirTemp("", "abxg")
		if err != nil {
			sharedGuestErr = err
			return
		}
		sharedGuestPath = filepath.Join(dir, "g.sock")
		ln, err := net.Listen("unix", sharedGuestPath)
		if err != nil {
			sharedGuestErr = err
			return
		}
		go func() { _ = guest.Serve(context.Background(), ln, guest.Options{Version: "test", Embedded: true}) }()
	})
	if sharedGuestErr != nil {
		t.Fatal(sharedGuestErr)
	}
	return sharedGuestPath
}

type fakeBackend struct {
	guestPath string
	mu        sync.Mutex
	created   int
	live      map[string]*fakeSandbox
}

type fakeSandbox struct {
	spec runtime.Spec
	ln   net.Listener
	done chan struct{}

	mu        sync.Mutex
	paused    bool
	destroyed bool
}

func (f *fakeBackend) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Name: "fake", Features: []string{runtime.CapPause}}
}

func (f *fakeBackend) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	ln, err := net.Listen("unix", spec.SocketPath)
	if err != nil {
		return nil, err
	}
	s := &fakeSandbox{spec: spec, ln: ln, done: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g, err := net.Dial("unix", f.guestPath)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(g, c); g.Close() }()
			go func() { _, _ = io.Copy(c, g); c.Close() }()
		}
	}()
	f.mu.Lock()
	f.created++
	f.live[spec.ID] = s
	f.mu.Unlock()
	return s, nil
}

func (f *fakeBackend) Recover(ctx context.Context, spec runtime.Spec, state []byte) (runtime.Sandbox, error) {
	return nil, errdefs.ErrNotFound
}

func (f *fakeBackend) Cleanup(ctx context.Context, spec runtime.Spec) error { return nil }

func (f *fakeBackend) get(id string) *fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[id]
}

func (s *fakeSandbox) ID() string            { return s.spec.ID }
func (s *fakeSandbox) SocketPath() string    { return s.spec.SocketPath }
func (s *fakeSandbox) State() []byte         { return []byte(`{}`) }
func (s *fakeSandbox) Wait() <-chan struct{} { return s.done }
func (s *fakeSandbox) Status(context.Context) (runtime.Status, error) {
	return runtime.StatusRunning, nil
}

func (s *fakeSandbox) Destroy(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.destroyed {
		s.destroyed = true
		s.ln.Close()
		_ = os.Remove(s.spec.SocketPath)
		close(s.done)
	}
	return nil
}

func (s *fakeSandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = true
	return nil
}

func (s *fakeSandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = false
	return nil
}

func (s *fakeSandbox) isPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

func (s *fakeSandbox) isDestroyed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.destroyed
}

// --- helpers ---

func newTestManager(t *testing.T) (*Manager, *clocktest.Fake, *fakeBackend) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clocktest.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	be := &fakeBackend{guestPath: sharedGuest(t), live: map[string]*fakeSandbox{}}
	runDir, err := os.MkdirTemp("", "abxr") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	m, err := New(Config{
		DataDir: filepath.Join(dir, "data"), RunDir: runDir, RunnerDir: filepath.Join(dir, "runner"),
		IDs:   runtime.IDMap{HostID: uint32(os.Getuid()), Size: 1},
		Clock: clk,
	}, registryOf(t, be), nil, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, clk, be
}

// createTest creates a sandbox as CreateSandbox does, minus the template.
func createTest(t *testing.T, m *Manager, req api.CreateSandboxRequest) string {
	t.Helper()
	if err := m.resolveLifecycle(&req); err != nil {
		t.Fatal(err)
	}
	id := newID()
	p := m.paths(id)
	lower := t.TempDir()
	sb := api.Sandbox{ID: id, State: api.StateCreating, Hostname: id, CreatedAt: m.cfg.Clock.Now(),
		Lifecycle: req.Lifecycle, Idle: req.Idle, Name: req.Name, Resources: req.Resources}
	if req.TimeoutSeconds > 0 {
		exp := m.cfg.Clock.Now().Add(time.Duration(req.TimeoutSeconds) * time.Second)
		sb.ExpiresAt = &exp
	}
	rec := store.SandboxRecord{Sandbox: sb, Layers: []string{lower}, UpperDir: p.upper, WorkDir: p.work, SocketPath: p.socket, StateDir: p.state}
	if _, err := m.start(context.Background(), rec, true); err != nil {
		t.Fatal(err)
	}
	return id
}

func state(t *testing.T, m *Manager, id string) string {
	t.Helper()
	sb, err := m.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

func causes(t *testing.T, m *Manager, id string) []string {
	t.Helper()
	ts, err := transitions(context.Background(), m, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tr := range ts {
		out = append(out, tr.From+">"+tr.To+":"+tr.Cause)
	}
	return out
}

// --- tests ---

func TestIdlePolicyDue(t *testing.T) {
	p := &api.IdlePolicy{PauseAfterSeconds: 60, HibernateAfterSeconds: 600, DeleteAfterSeconds: 3600}
	cases := []struct {
		state string
		idle  time.Duration
		want  string
	}{
		{api.StateRunning, 59 * time.Second, ""},
		{api.StateRunning, 60 * time.Second, api.StatePaused},
		{api.StateRunning, 601 * time.Second, api.StateHibernated}, // the deepest due step wins
		{api.StateRunning, 2 * time.Hour, api.StateDeleted},
		{api.StatePaused, 300 * time.Second, ""},
		{api.StatePaused, 600 * time.Second, api.StateHibernated},
		{api.StateHibernated, 600 * time.Second, ""},
		{api.StateStopped, time.Hour, api.StateDeleted},
		{api.StateFailed, 59 * time.Minute, ""},
		{api.StateDeleting, 2 * time.Hour, ""},
	}
	for _, c := range cases {
		if got := dueIdle(p, c.state, c.idle); got != c.want {
			t.Errorf("dueIdle(%s, %v) = %q, want %q", c.state, c.idle, got, c.want)
		}
	}
	t0 := time.Unix(1000, 0)
	if at, ok := nextIdle(p, api.StatePaused, t0); !ok || !at.Equal(t0.Add(600*time.Second)) {
		t.Errorf("nextIdle(paused) = %v %v", at, ok)
	}
	if _, ok := nextIdle(&api.IdlePolicy{PauseAfterSeconds: 60}, api.StatePaused, t0); ok {
		t.Error("nextIdle: nothing deeper than paused is set, but a step is due")
	}
	if _, ok := nextIdle(nil, api.StateRunning, t0); ok {
		t.Error("nextIdle(nil policy) is due")
	}
}

func TestResolveLifecycle(t *testing.T) {
	m, _, _ := newTestManager(t)
	req := api.CreateSandboxRequest{}
	if err := m.resolveLifecycle(&req); err != nil {
		t.Fatal(err)
	}
	if req.Lifecycle != api.LifecycleSession || *req.Idle != (api.IdlePolicy{PauseAfterSeconds: 300, DeleteAfterSeconds: 1800}) {
		t.Fatalf("session defaults: %s %+v", req.Lifecycle, *req.Idle)
	}
	req = api.CreateSandboxRequest{Lifecycle: "persistent", Idle: &api.IdlePolicy{PauseAfterSeconds: -1, DeleteAfterSeconds: 7200}}
	if err := m.resolveLifecycle(&req); err != nil {
		t.Fatal(err)
	}
	if *req.Idle != (api.IdlePolicy{HibernateAfterSeconds: 1800, DeleteAfterSeconds: 7200}) {
		t.Fatalf("persistent with overrides: %+v", *req.Idle)
	}
	for _, bad := range []api.CreateSandboxRequest{
		{Lifecycle: "forever"},
		{Name: "Not A Name"},
		{Idle: &api.IdlePolicy{PauseAfterSeconds: -2}},
		{Idle: &api.IdlePolicy{DeleteAfterSeconds: maxIdleSeconds + 1}},
	} {
		if err := m.resolveLifecycle(&bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: err %v, want invalid argument", bad, err)
		}
	}
}

// A session sandbox is paused, then deleted, by the idle policy alone.
func TestIdleSessionPausesThenDeletes(t *testing.T) {
	m, clk, be := newTestManager(t)
	id := createTest(t, m, api.CreateSandboxRequest{Idle: &api.IdlePolicy{PauseAfterSeconds: 60, DeleteAfterSeconds: 300}})
	clk.Advance(59 * time.Second)
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("after 59s idle: %s", s)
	}
	clk.Advance(time.Second)
	if s := state(t, m, id); s != api.StatePaused || !be.get(id).isPaused() {
		t.Fatalf("after 60s idle: %s (frozen %v)", s, be.get(id).isPaused())
	}
	got := causes(t, m, id)
	if want := []string{"creating>running:create", "running>paused:idle"}; !equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	clk.Advance(240 * time.Second)
	if _, err := m.GetSandbox(context.Background(), id); !errdefs.IsNotFound(err) {
		t.Fatalf("after 300s idle: %v, want not found", err)
	}
	if !be.get(id).isDestroyed() {
		t.Fatal("deleted sandbox's runtime not destroyed")
	}
}

// A persistent sandbox is paused then hibernated; a call wakes it, on a
// new guest, and the idle clock starts again from that call.
func TestIdlePersistentHibernatesAndWakesOnUse(t *testing.T) {
	m, clk, be := newTestManager(t)
	ctx := context.Background()
	id := createTest(t, m, api.CreateSandboxRequest{Lifecycle: "persistent", Idle: &api.IdlePolicy{PauseAfterSeconds: 60, HibernateAfterSeconds: 120}})
	first := be.get(id)
	clk.Advance(60 * time.Second)
	if s := state(t, m, id); s != api.StatePaused {
		t.Fatalf("after 60s: %s", s)
	}
	clk.Advance(60 * time.Second)
	if s := state(t, m, id); s != api.StateHibernated || !first.isDestroyed() {
		t.Fatalf("after 120s: %s (destroyed %v)", s, first.isDestroyed())
	}
	clk.Advance(24 * time.Hour) // persistent: never deleted
	if s := state(t, m, id); s != api.StateHibernated {
		t.Fatalf("after a day: %s", s)
	}
	if err := m.WithGuest(ctx, id, "listing processes", func(g *client.Client) error { _, err := g.Processes(ctx); return err }); err != nil {
		t.Fatalf("call on a hibernated sandbox: %v", err)
	}
	if s := state(t, m, id); s != api.StateRunning || be.get(id) == first || be.get(id).isDestroyed() {
		t.Fatalf("after wake: %s, new guest %v", s, be.get(id) != first)
	}
	want := []string{"creating>running:create", "running>paused:idle", "paused>hibernated:idle", "hibernated>running:wake"}
	if got := causes(t, m, id); !equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	clk.Advance(59 * time.Second)
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("59s after the waking call: %s", s)
	}
	clk.Advance(time.Second)
	if s := state(t, m, id); s != api.StatePaused {
		t.Fatalf("60s after the waking call: %s", s)
	}
	// Paused: a call thaws the same guest.
	second := be.get(id)
	if err := m.WithGuest(ctx, id, "listing processes", func(g *client.Client) error { _, err := g.Processes(ctx); return err }); err != nil {
		t.Fatal(err)
	}
	if second.isPaused() || be.get(id) != second || state(t, m, id) != api.StateRunning {
		t.Fatal("call on a paused sandbox did not thaw the same guest")
	}
}

// While a call or a stream is in progress the sandbox is not idle.
func TestIdleActivityHolds(t *testing.T) {
	m, clk, _ := newTestManager(t)
	id := createTest(t, m, api.CreateSandboxRequest{Idle: &api.IdlePolicy{PauseAfterSeconds: 60}})
	b, err := m.get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	done := m.busy(b) // an open exec stream
	clk.Advance(time.Hour)
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("paused while busy: %s", s)
	}
	done()
	done() // idempotent
	clk.Advance(59 * time.Second)
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("paused 59s after the stream ended: %s", s)
	}
	clk.Advance(time.Second)
	if s := state(t, m, id); s != api.StatePaused {
		t.Fatalf("not paused 60s after the stream ended: %s", s)
	}
}

// The hard lifetime does not run while a sandbox sleeps, unless asked.
func TestTTLExcludesSleep(t *testing.T) {
	m, clk, _ := newTestManager(t)
	ctx := context.Background()
	never := &api.IdlePolicy{PauseAfterSeconds: -1, DeleteAfterSeconds: -1}
	id := createTest(t, m, api.CreateSandboxRequest{TimeoutSeconds: 100, Idle: never})
	clk.Advance(40 * time.Second)
	if _, err := m.SetState(ctx, id, api.StatePaused); err != nil {
		t.Fatal(err)
	}
	if sb, _ := m.GetSandbox(ctx, id); sb.ExpiresAt != nil {
		t.Fatalf("paused sandbox shows expires_at %v", sb.ExpiresAt)
	}
	clk.Advance(time.Hour)
	if s := state(t, m, id); s != api.StatePaused {
		t.Fatalf("paused sandbox expired: %s", s)
	}
	sb, err := m.SetState(ctx, id, api.StateRunning)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(clk.Now().Add(60*time.Second)) {
		t.Fatalf("expires_at after resume %v, want now+60s", sb.ExpiresAt)
	}
	clk.Advance(59 * time.Second)
	if s := state(t, m, id); s != api.StateRunning {
		t.Fatalf("expired early: %s", s)
	}
	clk.Advance(time.Second)
	if _, err := m.GetSandbox(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("not deleted at the end of its lifetime: %v", err)
	}

	counting := &api.IdlePolicy{PauseAfterSeconds: -1, DeleteAfterSeconds: -1, TTLCountsAsleep: true}
	id = createTest(t, m, api.CreateSandboxRequest{TimeoutSeconds: 100, Idle: counting})
	if _, err := m.SetState(ctx, id, api.StateHibernated); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * time.Second)
	if _, err := m.GetSandbox(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("ttl_counts_asleep: hibernated sandbox outlived its lifetime: %v", err)
	}
}

// Explicit operations: no-ops in the target state, conflicts otherwise.
func TestExplicitTransitions(t *testing.T) {
	m, _, be := newTestManager(t)
	ctx := context.Background()
	id := createTest(t, m, api.CreateSandboxRequest{})
	for _, step := range []struct {
		op   func(context.Context, string) (api.Sandbox, error)
		want string
		err  error
	}{
		{setter(m, api.StatePaused), api.StatePaused, nil},
		{setter(m, api.StatePaused), api.StatePaused, nil},
		{setter(m, api.StateHibernated), api.StateHibernated, nil},
		{setter(m, api.StatePaused), "", errdefs.ErrConflict},
		{setter(m, api.StateHibernated), api.StateHibernated, nil},
		{setter(m, api.StateRunning), api.StateRunning, nil},
		{setter(m, api.StateRunning), api.StateRunning, nil},
		{setter(m, api.StateHibernated), api.StateHibernated, nil},
	} {
		sb, err := step.op(ctx, id)
		if step.err != nil {
			if !errors.Is(err, step.err) {
				t.Fatalf("err %v, want %v", err, step.err)
			}
			continue
		}
		if err != nil || sb.State != step.want {
			t.Fatalf("state %s err %v, want %s", sb.State, err, step.want)
		}
	}
	want := []string{"creating>running:create", "running>paused:api", "paused>hibernated:api", "hibernated>running:api", "running>hibernated:api"}
	if got := causes(t, m, id); !equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	rec, err := m.store.GetSandbox(ctx, id)
	if err != nil || rec.Sandbox.State != api.StateHibernated || len(rec.Transitions) != len(want) || rec.RuntimeState != nil {
		t.Fatalf("persisted record: state %s, %d transitions, runtime state %q, err %v", rec.Sandbox.State, len(rec.Transitions), rec.RuntimeState, err)
	}
	if err := m.DeleteSandbox(ctx, id); err != nil {
		t.Fatalf("deleting a hibernated sandbox: %v", err)
	}
	if _, err := m.SetState(ctx, id, api.StatePaused); !errdefs.IsNotFound(err) {
		t.Fatalf("pause after delete: %v", err)
	}
	_ = be
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// setter is m.SetState to state to as a function of the sandbox id.
func setter(m *Manager, to string) func(context.Context, string) (api.Sandbox, error) {
	return func(ctx context.Context, id string) (api.Sandbox, error) { return m.SetState(ctx, id, to) }
}

// transitions is sandbox id's Handle.Transitions as the caller of ctx
// sees it.
func transitions(ctx context.Context, m *Manager, id string) ([]api.Transition, error) {
	h, err := m.Handle(ctx, id)
	if err != nil {
		return nil, err
	}
	return h.Transitions(), nil
}
