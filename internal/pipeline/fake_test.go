package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/clock/clocktest"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// fakeSandboxes is an in-memory Sandboxes. Each exec emits started, its
// stdin (or "ok") on stdout and exit with exitCode; when it ends it adds
// burn to the sandbox's CPU counter.
type fakeSandboxes struct {
	mu       sync.Mutex
	n        int
	boxes    map[string]api.Sandbox
	stats    map[string]runtime.Stats
	deleted  []string
	execs    []api.ExecRequest
	burn     time.Duration
	exitCode int
	// hold, when set, blocks each exec stream before its exit until closed;
	// watchHold does the same for the streams of WatchProcess.
	hold, watchHold chan struct{}
}

func newFakeSandboxes() *fakeSandboxes {
	return &fakeSandboxes{boxes: map[string]api.Sandbox{}, stats: map[string]runtime.Stats{}}
}

func (f *fakeSandboxes) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Template == "missing" {
		return api.Sandbox{}, fmt.Errorf("template missing: %w", errdefs.ErrNotFound)
	}
	if req.Name != "" {
		for _, b := range f.boxes {
			if b.Name == req.Name {
				return b, nil
			}
		}
	}
	f.n++
	tmpl := req.Template
	if tmpl == "" {
		tmpl = "busybox"
	}
	sb := api.Sandbox{ID: fmt.Sprintf("sb%d", f.n), Template: tmpl, Name: req.Name, Labels: req.Labels, State: api.StateRunning}
	f.boxes[sb.ID] = sb
	f.stats[sb.ID] = runtime.Stats{MemoryBytes: 1 << 30}
	return sb, nil
}

func (f *fakeSandboxes) LookupSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.boxes[id]
	if !ok {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (f *fakeSandboxes) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Sandbox
	for _, b := range f.boxes {
		out = append(out, b)
	}
	return out, nil
}

func (f *fakeSandboxes) DeleteSandbox(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.boxes[id]; !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	delete(f.boxes, id)
	f.deleted = append(f.deleted, id)
	return nil
}

func (f *fakeSandboxes) stream(id string, req api.ExecRequest) (*fakeStream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.boxes[id]; !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	f.execs = append(f.execs, req)
	out := req.Stdin
	if out == nil {
		out = []byte("ok")
	}
	code := f.exitCode
	s := &fakeStream{f: f, id: id, hold: f.hold, closed: make(chan struct{}), evs: []api.ExecEvent{
		{Type: api.EventStarted, Pid: len(f.execs)},
		{Type: api.EventStdout, Data: out},
		{Type: api.EventExit, ExitCode: &code},
	}}
	return s, nil
}

func (f *fakeSandboxes) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	return f.stream(id, req)
}

func (f *fakeSandboxes) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	s, err := f.stream(id, req)
	if err != nil {
		return api.Process{}, err
	}
	return api.Process{Pid: s.evs[0].Pid, Running: true}, nil
}

func (f *fakeSandboxes) WatchProcess(ctx context.Context, id string, pid int) (execstream.Stream, error) {
	code := f.exitCode
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.boxes[id]; !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return &fakeStream{f: f, id: id, hold: f.watchHold, closed: make(chan struct{}), evs: []api.ExecEvent{{Type: api.EventExit, ExitCode: &code}}}, nil
}

func (f *fakeSandboxes) SandboxStats(ctx context.Context, id string) (runtime.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.stats[id]
	if !ok {
		return runtime.Stats{}, errdefs.ErrNotFound
	}
	return st, nil
}

func (f *fakeSandboxes) execCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.execs)
}

type fakeStream struct {
	f      *fakeSandboxes
	id     string
	evs    []api.ExecEvent
	hold   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (s *fakeStream) Next() (api.ExecEvent, error) {
	if len(s.evs) == 0 {
		return api.ExecEvent{}, io.EOF
	}
	ev := s.evs[0]
	if ev.Type == api.EventExit {
		if s.hold != nil {
			select {
			case <-s.hold:
			case <-s.closed:
				return api.ExecEvent{}, errors.New("stream closed")
			}
		}
		s.f.mu.Lock()
		st := s.f.stats[s.id]
		st.CPUTime += s.f.burn
		s.f.stats[s.id] = st
		s.f.mu.Unlock()
	}
	s.evs = s.evs[1:]
	return ev, nil
}

func (s *fakeStream) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// env is a pipeline over fakes and a real store in a temp dir.
type env struct {
	clk *clocktest.Fake
	sbx *fakeSandboxes
	st  *store.Bolt
	p   *Pipeline
}

var t0 = time.Date(2030, 1, 7, 7, 30, 0, 0, time.UTC) // a Monday

func newEnv(t *testing.T) *env {
	t.Helper()
	st, err := store.Open(t.TempDir() + "/meta.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{clk: clocktest.NewFake(t0), sbx: newFakeSandboxes(), st: st}
	e.p = e.newPipeline(t)
	return e
}

func (e *env) newPipeline(t *testing.T) *Pipeline {
	t.Helper()
	p, err := New(Config{Sandboxes: e.sbx, Store: e.st, Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
