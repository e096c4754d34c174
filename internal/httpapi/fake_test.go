package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

// fakeService implements Service in memory. err, when set, is returned by
// every method; panicOn names a method that panics.
type fakeService struct {
	mu        sync.Mutex
	err       error
	panicOn   string
	calls     []string
	lastQuery api.EventQuery // the last AuditEvents query
	upload    []byte         // what WriteFile/WriteArchive/WriteStdin read
	chunks    chan []byte    // when set, uploads report each chunk read
	stream    *fakeStream    // returned by Exec/Attach when set
	progress  []api.BuildEvent
	lastExec  api.ExecRequest
	lastArgs  []any
	watch     *fakeWatch // returned by WatchDir
}

var _ Service = (*fakeService)(nil)

func (f *fakeService) call(name string, args ...any) error {
	f.mu.Lock()
	f.calls = append(f.calls, name)
	f.lastArgs = args
	err, p := f.err, f.panicOn
	f.mu.Unlock()
	if p == name {
		panic("boom in " + name)
	}
	return err
}

func (f *fakeService) lastCall() (string, []any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return "", nil
	}
	return f.calls[len(f.calls)-1], f.lastArgs
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func sandbox(id string) api.Sandbox {
	return api.Sandbox{ID: id, Template: "busybox", State: api.StateRunning, Backend: "native", CreatedAt: t0}
}

func fileInfo(p string) api.FileInfo {
	return api.FileInfo{Name: p[strings.LastIndexByte(p, '/')+1:], Path: p, Type: api.FileTypeFile, Size: 5, Mode: 0o640, ModTime: t0}
}

func (f *fakeService) Info(ctx context.Context) (api.Info, error) {
	return api.Info{Version: "test", API: api.Version, Backend: "native", Capabilities: []string{"userns"}}, f.call("Info")
}
func (f *fakeService) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return sandbox("sb-new"), f.call("CreateSandbox", req)
}
func (f *fakeService) ListSandboxes(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	return []api.Sandbox{sandbox("a"), sandbox("b")}, f.call("ListSandboxes", labels)
}

// ResolveSandbox knows one name: "web1", of sandbox "sb-web1".
func (f *fakeService) ResolveSandbox(ctx context.Context, ref string) string {
	if ref == "web1" {
		return "sb-web1"
	}
	return ref
}
func (f *fakeService) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	if err := f.call("GetSandbox", id); err != nil {
		return api.Sandbox{}, err
	}
	if id == "missing" {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sandbox(id), nil
}
func (f *fakeService) DeleteSandbox(ctx context.Context, id string) error {
	return f.call("DeleteSandbox", id)
}
func (f *fakeService) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	f.mu.Lock()
	f.lastExec = req
	f.mu.Unlock()
	if err := f.call("Exec", id); err != nil {
		return nil, err
	}
	return f.newStream(), nil
}
func (f *fakeService) newStream() execstream.Stream {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stream != nil {
		return f.stream
	}
	s := newFakeStream()
	code := 0
	s.events <- api.ExecEvent{Type: api.EventStarted, Pid: 7}
	s.events <- api.ExecEvent{Type: api.EventStdout, Data: []byte("hi\n")}
	s.events <- api.ExecEvent{Type: api.EventExit, ExitCode: &code}
	return s
}
func (f *fakeService) StartProcess(ctx context.Context, id string, req api.ExecRequest) (api.Process, error) {
	return api.Process{Pid: 9, Cmd: req.Cmd, Running: true, StartedAt: t0}, f.call("StartProcess", id)
}
func (f *fakeService) Attach(ctx context.Context, id string, pid int, replay bool) (execstream.Stream, error) {
	if err := f.call("Attach", id, pid, replay); err != nil {
		return nil, err
	}
	return f.newStream(), nil
}
func (f *fakeService) ListProcesses(ctx context.Context, id string) ([]api.Process, error) {
	return nil, f.call("ListProcesses", id)
}
func (f *fakeService) readUpload(r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			f.mu.Lock()
			f.upload = append(f.upload, buf[:n]...)
			ch := f.chunks
			f.mu.Unlock()
			if ch != nil {
				ch <- append([]byte(nil), buf[:n]...)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading upload: %w", err)
		}
	}
}
func (f *fakeService) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	if err := f.call("WriteStdin", id, pid, closeAfter); err != nil {
		return err
	}
	return f.readUpload(r)
}
func (f *fakeService) Signal(ctx context.Context, id string, pid int, sig string) error {
	return f.call("Signal", id, pid, sig)
}
func (f *fakeService) Resize(ctx context.Context, id string, pid int, tty api.TTY) error {
	return f.call("Resize", id, pid, tty)
}
func (f *fakeService) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, api.FileInfo, error) {
	if err := f.call("ReadFile", id, path); err != nil {
		return nil, api.FileInfo{}, err
	}
	return io.NopCloser(strings.NewReader("hello")), fileInfo(path), nil
}
func (f *fakeService) WriteFile(ctx context.Context, id, path string, mode uint32, parents bool, r io.Reader) (api.FileInfo, error) {
	if err := f.call("WriteFile", id, path, mode, parents); err != nil {
		return api.FileInfo{}, err
	}
	if err := f.readUpload(r); err != nil {
		return api.FileInfo{}, err
	}
	return fileInfo(path), nil
}
func (f *fakeService) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	return fileInfo(path), f.call("Stat", id, path)
}
func (f *fakeService) List(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	return []api.FileInfo{fileInfo(path + "/x")}, f.call("List", id, path)
}
func (f *fakeService) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (api.FileInfo, error) {
	return fileInfo(req.Path), f.call("Mkdir", id, req)
}
func (f *fakeService) Move(ctx context.Context, id string, req api.MoveRequest) error {
	return f.call("Move", id, req)
}
func (f *fakeService) Remove(ctx context.Context, id, path string, recursive bool) error {
	return f.call("Remove", id, path, recursive)
}
func (f *fakeService) ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error) {
	if err := f.call("ReadArchive", id, path); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("tar-bytes")), nil
}
func (f *fakeService) WriteArchive(ctx context.Context, id, path string, r io.Reader) error {
	if err := f.call("WriteArchive", id, path); err != nil {
		return err
	}
	return f.readUpload(r)
}
func (f *fakeService) ListTemplates(ctx context.Context) ([]api.Template, error) {
	return []api.Template{{Name: "busybox", Built: true, Builtin: true}}, f.call("ListTemplates")
}
func (f *fakeService) GetTemplate(ctx context.Context, name string) (api.Template, error) {
	return api.Template{Name: name, Builtin: true}, f.call("GetTemplate", name)
}
func (f *fakeService) BuildTemplate(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (api.Template, error) {
	f.mu.Lock()
	evs := f.progress
	err := f.err
	f.err = nil // so call() below does not fail before progress
	f.mu.Unlock()
	_ = f.call("BuildTemplate", req)
	for _, ev := range evs {
		progress(ev)
	}
	if err != nil {
		return api.Template{}, err
	}
	return api.Template{Name: "built", Built: true}, nil
}

// fakeStream is an execstream.Stream fed through a channel.
type fakeStream struct {
	events    chan api.ExecEvent
	closed    chan struct{}
	closeOnce sync.Once
	done      bool
}

var _ execstream.Stream = (*fakeStream)(nil)

func newFakeStream() *fakeStream {
	return &fakeStream{events: make(chan api.ExecEvent, 16), closed: make(chan struct{})}
}

func (s *fakeStream) Next() (api.ExecEvent, error) {
	if s.done {
		return api.ExecEvent{}, io.EOF
	}
	select {
	case ev := <-s.events:
		if ev.Type == api.EventExit || ev.Type == api.EventError {
			s.done = true
		}
		return ev, nil
	case <-s.closed:
		return api.ExecEvent{}, errors.New("stream closed")
	}
}

func (s *fakeStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

func (s *fakeStream) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// routeCase is one request to a fresh handler serving a fakeService that
// fails with err: the status it must get and the one service call it must
// make (with args, when set); call "" means the service must not be called.
type routeCase struct {
	method, path, body string
	err                error
	status             int
	call               string
	args               []any
}

// serve runs tc and checks its status and call. called is false when tc
// expects no call (nothing more to check).
func (tc routeCase) serve(t *testing.T) (f *fakeService, rec *httptest.ResponseRecorder, called bool) {
	t.Helper()
	f = &fakeService{err: tc.err}
	rec = httptest.NewRecorder()
	New(f, Options{}).ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
	if rec.Code != tc.status {
		t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
	}
	if tc.call == "" {
		if len(f.calls) != 0 {
			t.Fatalf("service called on invalid input: %v", f.calls)
		}
		return f, rec, false
	}
	if len(f.calls) != 1 || f.calls[0] != tc.call {
		t.Fatalf("calls %v, want %s", f.calls, tc.call)
	}
	if tc.args != nil && !reflect.DeepEqual(f.lastArgs, tc.args) {
		t.Fatalf("args %#v, want %#v", f.lastArgs, tc.args)
	}
	return f, rec, true
}
