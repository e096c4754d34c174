package e2b

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/tenant"
)

// fakeSandboxes is an in-memory Sandboxes with tenancy: a sandbox of
// another tenant is not found, as the daemon's service answers.
type fakeSandboxes struct {
	mu       sync.Mutex
	n        int
	sbs      map[string]api.Sandbox
	files    map[string][]byte // sandbox id + path
	execs    []api.ExecRequest
	exits    int // exit code of Exec'd commands other than the set-up
	stdin    bytes.Buffer
	signals  []string
	lastWho  string
	timeouts map[string]time.Duration
}

func newFake() *fakeSandboxes {
	return &fakeSandboxes{sbs: map[string]api.Sandbox{}, files: map[string][]byte{}, timeouts: map[string]time.Duration{}}
}

var _ Sandboxes = (*fakeSandboxes)(nil)

func (f *fakeSandboxes) lookup(ctx context.Context, id string) (api.Sandbox, error) {
	sb, ok := f.sbs[id]
	if !ok || !tenant.From(ctx).Sees(sb.Tenant) {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (f *fakeSandboxes) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Template == "missing" {
		return api.Sandbox{}, fmt.Errorf("template %s: %w", req.Template, errdefs.ErrNotFound)
	}
	f.n++
	id := fmt.Sprintf("sbx%09d", f.n)
	sb := api.Sandbox{ID: id, Tenant: tenant.From(ctx).Tenant, Template: req.Template, State: api.StateRunning, Labels: req.Labels, Env: req.Env,
		CreatedAt: time.Date(2030, 1, 1, 0, 0, f.n, 0, time.UTC)}
	if req.TimeoutSeconds > 0 {
		exp := sb.CreatedAt.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		sb.ExpiresAt = &exp
	}
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeSandboxes) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookup(ctx, id)
}

func (f *fakeSandboxes) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Sandbox
	for _, sb := range f.sbs {
		if !tenant.From(ctx).Sees(sb.Tenant) {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && sb.Labels[k] == v
		}
		if match {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (f *fakeSandboxes) DeleteSandbox(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(ctx, id); err != nil {
		return err
	}
	delete(f.sbs, id)
	return nil
}

func (f *fakeSandboxes) setState(ctx context.Context, id, state string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(ctx, id)
	if err != nil {
		return sb, err
	}
	sb.State = state
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeSandboxes) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return f.setState(ctx, id, api.StatePaused)
}

func (f *fakeSandboxes) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	return f.setState(ctx, id, api.StateRunning)
}

func (f *fakeSandboxes) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(ctx, id)
	if err != nil {
		return sb, err
	}
	f.timeouts[id] = d
	exp := sb.CreatedAt.Add(d)
	sb.ExpiresAt = &exp
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeSandboxes) SandboxStats(ctx context.Context, id string) (Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(ctx, id); err != nil {
		return Stats{}, err
	}
	return Stats{CPUTime: time.Second, MemoryBytes: 1 << 20}, nil
}

func (f *fakeSandboxes) SandboxTransitions(ctx context.Context, id string) ([]api.Transition, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return []api.Transition{
		{From: api.StateCreating, To: api.StateRunning, Cause: api.CauseCreate, At: sb.CreatedAt},
		{From: api.StateRunning, To: api.StatePaused, Cause: api.CauseAPI, At: sb.CreatedAt.Add(time.Second)},
	}, nil
}

// fakeStream yields a started event, the command's stdout ("out:" and its
// last argument) and an exit.
type fakeStream struct {
	evs    []api.ExecEvent
	closed bool
}

func (s *fakeStream) Next() (api.ExecEvent, error) {
	if len(s.evs) == 0 {
		return api.ExecEvent{}, io.EOF
	}
	ev := s.evs[0]
	s.evs = s.evs[1:]
	return ev, nil
}

func (s *fakeStream) Close() error { s.closed = true; return nil }

func (f *fakeSandboxes) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(ctx, id); err != nil {
		return nil, err
	}
	f.execs = append(f.execs, req)
	f.lastWho = CallerFrom(ctx)
	code := 0
	if !strings.Contains(strings.Join(req.Cmd, " "), "id user") {
		code = f.exits
	}
	return &fakeStream{evs: []api.ExecEvent{
		{Type: api.EventStarted, Pid: 7},
		{Type: api.EventStdout, Data: []byte("out:" + req.Cmd[len(req.Cmd)-1])},
		{Type: api.EventStderr, Data: []byte("err")},
		{Type: api.EventExit, ExitCode: &code},
	}}, nil
}

func (f *fakeSandboxes) Attach(ctx context.Context, id string, pid int, replay bool) (execstream.Stream, error) {
	code := 0
	return &fakeStream{evs: []api.ExecEvent{{Type: api.EventStdout, Data: []byte("attached")}, {Type: api.EventExit, ExitCode: &code}}}, nil
}

func (f *fakeSandboxes) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	return []api.Process{{Pid: 7, Cmd: []string{"/bin/bash", "-l", "-c", "sleep 1"}, Running: true}, {Pid: 8, Cmd: []string{"true"}}}, nil
}

func (f *fakeSandboxes) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := io.Copy(&f.stdin, r)
	return err
}

func (f *fakeSandboxes) Signal(ctx context.Context, id string, pid int, sig string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, fmt.Sprintf("%d:%s", pid, sig))
	return nil
}

func (f *fakeSandboxes) Resize(ctx context.Context, id string, pid int, tty api.TTY) error {
	return nil
}

func (f *fakeSandboxes) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(ctx, id); err != nil {
		return nil, api.FileInfo{}, err
	}
	b, ok := f.files[id+path]
	if !ok {
		return nil, api.FileInfo{}, fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(b)), api.FileInfo{Path: path, Size: int64(len(b)), Type: api.FileTypeFile}, nil
}

func (f *fakeSandboxes) WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return api.FileInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(ctx, id); err != nil {
		return api.FileInfo{}, err
	}
	f.files[id+path] = b
	return api.FileInfo{Path: path, Size: int64(len(b)), Type: api.FileTypeFile}, nil
}

func (f *fakeSandboxes) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.files[id+path]; ok {
		return api.FileInfo{Name: path[strings.LastIndexByte(path, '/')+1:], Path: path, Size: int64(len(b)), Type: api.FileTypeFile, Mode: 0o644, UID: 1000, GID: 1000}, nil
	}
	return api.FileInfo{}, fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) List(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	return nil, nil
}

func (f *fakeSandboxes) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error) {
	return api.FileInfo{Path: req.Path, Type: api.FileTypeDir}, nil
}

func (f *fakeSandboxes) Move(ctx context.Context, id string, req api.MoveRequest) error { return nil }

func (f *fakeSandboxes) Remove(ctx context.Context, id, path string, recursive bool) error {
	return nil
}

func (f *fakeSandboxes) CreateCheckpoint(ctx context.Context, id string, req api.CreateCheckpointRequest) (api.Checkpoint, error) {
	return api.Checkpoint{}, fmt.Errorf("checkpoints: %w", errdefs.ErrNotImplemented)
}

func (f *fakeSandboxes) ListCheckpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	return nil, nil
}

func (f *fakeSandboxes) GetCheckpoint(ctx context.Context, cid string) (api.Checkpoint, error) {
	return api.Checkpoint{}, fmt.Errorf("checkpoint %s: %w", cid, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) DeleteCheckpoint(ctx context.Context, cid string) error {
	return fmt.Errorf("checkpoint %s: %w", cid, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (api.ForkResult, error) {
	return api.ForkResult{}, fmt.Errorf("checkpoint %s: %w", cid, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error) {
	return api.ForkResult{}, fmt.Errorf("fork: %w", errdefs.ErrNotImplemented)
}
