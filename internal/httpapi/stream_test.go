package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
)

func waitClosed(t *testing.T, s *fakeStream) {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("stream was not closed")
	}
}

// The first event reaches the client while the stream is still open.
func TestExecStreamFlushesEachEvent(t *testing.T) {
	stream := newFakeStream()
	svc := &fakeService{stream: stream}
	h, _ := newTestHandler(t, svc, Options{})
	srv := httptest.NewServer(h)
	defer srv.Close()

	stream.events <- api.ExecEvent{Type: api.EventStarted, Pid: 42}
	resp, err := http.Post(srv.URL+"/v1/sandboxes/abc/exec", "application/json", strings.NewReader(`{"cmd":["sleep","1"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	readOne := func() api.ExecEvent {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("reading event: %v", err)
		}
		var ev api.ExecEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := readOne(); ev.Type != api.EventStarted || ev.Pid != 42 {
		t.Fatalf("first event %+v", ev)
	}
	stream.events <- api.ExecEvent{Type: api.EventStderr, Data: []byte{0, 0xff}}
	if ev := readOne(); ev.Type != api.EventStderr || string(ev.Data) != "\x00\xff" {
		t.Fatalf("second event %+v", ev)
	}
	code := 3
	stream.events <- api.ExecEvent{Type: api.EventExit, ExitCode: &code}
	if ev := readOne(); ev.Type != api.EventExit || *ev.ExitCode != 3 {
		t.Fatalf("exit event %+v", ev)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("stream did not end after exit: %v", err)
	}
	waitClosed(t, stream)
}

func TestClientDisconnectClosesStream(t *testing.T) {
	for _, target := range []string{"/v1/sandboxes/abc/exec", "/v1/sandboxes/abc/processes/5/attach"} {
		t.Run(target, func(t *testing.T) {
			stream := newFakeStream()
			svc := &fakeService{stream: stream}
			h, _ := newTestHandler(t, svc, Options{})
			srv := httptest.NewServer(h)
			defer srv.Close()
			stream.events <- api.ExecEvent{Type: api.EventStarted, Pid: 5}

			ctx, cancel := context.WithCancel(context.Background())
			method, body := "GET", io.Reader(nil)
			if strings.HasSuffix(target, "exec") {
				method, body = "POST", strings.NewReader(`{"command":"sleep 100"}`)
			}
			req, _ := http.NewRequestWithContext(ctx, method, srv.URL+target, body)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bufio.NewReader(resp.Body).ReadBytes('\n'); err != nil {
				t.Fatal(err)
			}
			if stream.isClosed() {
				t.Fatal("closed too early")
			}
			cancel()
			resp.Body.Close()
			waitClosed(t, stream)
		})
	}
}

func TestStreamErrorMidway(t *testing.T) {
	stream := &errStream{events: []api.ExecEvent{{Type: api.EventStarted, Pid: 1}}, err: fmt.Errorf("guest at /secret went away")}
	svc := &fakeService{}
	h, logs := newTestHandler(t, &streamSvc{fakeService: svc, s: stream}, Options{})
	rec := do(h, "POST", "/v1/sandboxes/abc/exec", `{"command":"x"}`)
	evs := readEvents(t, rec.Body)
	if len(evs) != 2 || evs[1].Type != api.EventError || evs[1].Error.Code != "internal" || strings.Contains(evs[1].Error.Message, "secret") {
		t.Fatalf("events %+v", evs)
	}
	if evs[1].Error.RequestID != rec.Header().Get(api.RequestIDHeader) || !strings.Contains(logs.String(), "/secret") {
		t.Fatalf("error event not tied to the log line: %s", logs)
	}
	if !stream.closed {
		t.Fatal("stream not closed")
	}
}

type errStream struct {
	events []api.ExecEvent
	err    error
	closed bool
}

func (s *errStream) Next() (api.ExecEvent, error) {
	if len(s.events) == 0 {
		return api.ExecEvent{}, s.err
	}
	ev := s.events[0]
	s.events = s.events[1:]
	return ev, nil
}
func (s *errStream) Close() error { s.closed = true; return nil }

type streamSvc struct {
	*fakeService
	s execstream.Stream
}

func (s *streamSvc) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	return s.s, nil
}

func TestBuildStream(t *testing.T) {
	svc := &fakeService{progress: []api.BuildEvent{
		{Type: api.BuildEventStep, Step: 1, Steps: 2, Message: "RUN x"},
		{Type: api.BuildEventLog, Message: "line"},
		{Type: api.BuildEventDone}, // dropped: the edge sends the final event
	}}
	h, _ := newTestHandler(t, svc, Options{})
	rec := do(h, "POST", "/v1/templates/build", `{"spec":{"name":"t","base":"busybox","steps":[{"run":"x"}]}}`)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	var evs []api.BuildEvent
	dec := json.NewDecoder(rec.Body)
	for dec.More() {
		var ev api.BuildEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if len(evs) != 3 || evs[0].Type != "step" || evs[1].Type != "log" || evs[2].Type != "done" || evs[2].Template.Name != "built" {
		t.Fatalf("events %+v", evs)
	}

	// Failure before any progress: a plain JSON error.
	svc = &fakeService{err: fmt.Errorf("template nope: %w", errdefs.ErrNotFound)}
	h, _ = newTestHandler(t, svc, Options{})
	rec = do(h, "POST", "/v1/templates/build", `{"name":"nope"}`)
	if rec.Code != 404 || decodeError(t, rec).Code != "not_found" {
		t.Fatalf("early failure: %d %s", rec.Code, rec.Body)
	}

	// Failure after progress: the final error event.
	svc = &fakeService{err: fmt.Errorf("step 1 failed: %w", errdefs.ErrFailedPrecondition),
		progress: []api.BuildEvent{{Type: api.BuildEventStep, Step: 1, Steps: 1}}}
	h, _ = newTestHandler(t, svc, Options{})
	rec = do(h, "POST", "/v1/templates/build", `{"name":"x"}`)
	lines := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
	var last api.BuildEvent
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || len(lines) != 2 {
		t.Fatalf("%v %q", err, lines)
	}
	if last.Type != "error" || last.Error.Code != "failed_precondition" || !strings.Contains(last.Error.Message, "step 1 failed") {
		t.Fatalf("last event %+v", last)
	}
}

// Uploads are streamed: the service sees the first chunk before the client
// has sent the rest (a buffering handler would deadlock here).
func TestUploadIsStreamed(t *testing.T) {
	for _, target := range []string{"/v1/sandboxes/abc/files?path=/big", "/v1/sandboxes/abc/fs/archive?path=/d", "/v1/sandboxes/abc/processes/3/stdin"} {
		t.Run(target, func(t *testing.T) {
			chunks := make(chan []byte, 64)
			svc := &fakeService{chunks: chunks}
			h, _ := newTestHandler(t, svc, Options{MaxBodyBytes: 1024})
			srv := httptest.NewServer(h)
			defer srv.Close()

			pr, pw := io.Pipe()
			method := "PUT"
			if strings.Contains(target, "stdin") {
				method = "POST"
			}
			req, _ := http.NewRequest(method, srv.URL+target, pr)
			done := make(chan *http.Response, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
				}
				done <- resp
			}()
			first := strings.Repeat("a", 4096)
			if _, err := pw.Write([]byte(first)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-chunks:
			case <-time.After(5 * time.Second):
				t.Fatal("service saw nothing before the upload ended: body buffered")
			}
			// Well past MaxBodyBytes: uploads are not JSON-limited.
			big := strings.Repeat("b", 3<<20)
			go func() { pw.Write([]byte(big)); pw.Close() }()
			go func() {
				for range chunks {
				}
			}()
			resp := <-done
			if resp == nil {
				t.FailNow()
			}
			resp.Body.Close()
			if resp.StatusCode >= 300 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			svc.mu.Lock()
			n := len(svc.upload)
			svc.mu.Unlock()
			if n != len(first)+len(big) {
				t.Fatalf("service read %d bytes", n)
			}
		})
	}
}

func TestUploadLimit(t *testing.T) {
	h, _ := newTestHandler(t, &fakeService{}, Options{MaxUploadBytes: 10})
	rec := do(h, "PUT", "/v1/sandboxes/abc/files?path=/x", strings.Repeat("z", 100))
	if rec.Code != 413 || decodeError(t, rec).Code != "too_large" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "PUT", "/v1/sandboxes/abc/files?path=/x", "small"); rec.Code != 200 {
		t.Fatalf("small upload: %d", rec.Code)
	}
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "abx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestListenUnix(t *testing.T) {
	dir := shortTempDir(t)
	path := filepath.Join(dir, "run", "agentbox.sock")
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %v %v", fi.Mode(), err)
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o711 {
		t.Fatalf("dir mode %v", di.Mode())
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// A live daemon is never displaced.
	if _, err := ListenUnix(path); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second listen: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("leftover files: %v", entries)
	}
	l.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket not removed on close: %v", err)
	}

	// A stale socket (nobody answers) is replaced.
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	ul.Close()
	l2, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l2.Close()

	// A regular file is never removed.
	if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("regular file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "keep" {
		t.Fatal("regular file clobbered")
	}
}

func TestServerShutdownEndsStreams(t *testing.T) {
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "a.sock")
	ul, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stream := newFakeStream()
	svc := &fakeService{stream: stream}
	hUnix, _ := newTestHandler(t, svc, Options{})
	hTCP, _ := newTestHandler(t, svc, Options{RequireAuth: true, APIKeys: []string{"key-0123456789abcdef"}})
	s := NewServer(nil, Endpoint{ul, hUnix}, Endpoint{tl, hTCP})
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()

	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	if resp, err := http.Get("http://" + tl.Addr().String() + "/v1/info"); err != nil || resp.StatusCode != 401 {
		t.Fatalf("tcp without key: %v %v", resp, err)
	}
	stream.events <- api.ExecEvent{Type: api.EventStarted, Pid: 1}
	resp, err := client.Post("http://agentbox/v1/sandboxes/abc/exec", "application/json", strings.NewReader(`{"command":"sleep 100"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadBytes('\n'); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("shutdown waited for the stream")
	}
	waitClosed(t, stream)
	rest, _ := io.ReadAll(br)
	var ev api.ExecEvent
	if err := json.Unmarshal(rest, &ev); err != nil || ev.Type != api.EventError || ev.Error.Code != "unavailable" {
		t.Fatalf("final event %q: %v", rest, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("socket left behind")
	}
}
