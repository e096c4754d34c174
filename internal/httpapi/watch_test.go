package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// fakeWatch is an FSEvents fed by a channel; Close unblocks Next.
type fakeWatch struct {
	events chan api.FSEvent
	closed chan struct{}
}

func (w *fakeWatch) Next() (api.FSEvent, error) {
	select {
	case ev, ok := <-w.events:
		if !ok {
			return api.FSEvent{}, io.EOF
		}
		return ev, nil
	case <-w.closed:
		return api.FSEvent{}, io.EOF
	}
}

func (w *fakeWatch) Close() error {
	select {
	case <-w.closed:
	default:
		close(w.closed)
	}
	return nil
}

// WatchDir implements WatchService: it returns f.watch.
func (f *fakeService) WatchDir(ctx context.Context, id, path string, recursive bool) (FSEvents, error) {
	if err := f.call("WatchDir", id, path, recursive); err != nil {
		return nil, err
	}
	if f.watch == nil {
		return nil, fmt.Errorf("no watch: %w", errdefs.ErrNotFound)
	}
	return f.watch, nil
}

// GET fs/watch answers 200 at once, streams each event as a line as it
// happens, and closes the watch when the client goes away.
func TestWatchStreamsEvents(t *testing.T) {
	w := &fakeWatch{events: make(chan api.FSEvent), closed: make(chan struct{})}
	svc := &fakeService{watch: w}
	h := New(svc, Options{})
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/sandboxes/abc/fs/watch?path=/tmp&recursive=true")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
	if name, args := svc.lastCall(); name != "WatchDir" || args[1] != "/tmp" || args[2] != true {
		t.Errorf("last call %s%v, want WatchDir of /tmp recursive", name, args)
	}
	br := bufio.NewReader(resp.Body)
	for _, want := range []api.FSEvent{{Type: api.FSEventCreate, Path: "/tmp/a", Name: "a"}, {Type: api.FSEventRemove, Path: "/tmp/a", Name: "a"}} {
		w.events <- want
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var got api.FSEvent
		if err := json.Unmarshal(line, &got); err != nil || got != want {
			t.Fatalf("event %s (%v), want %+v", line, err, want)
		}
	}
	resp.Body.Close()
	select {
	case <-w.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch was not closed when the client went away")
	}
}

// A relative path is refused before any watch starts.
func TestWatchRefusesRelativePath(t *testing.T) {
	svc := &fakeService{watch: &fakeWatch{events: make(chan api.FSEvent), closed: make(chan struct{})}}
	srv := httptest.NewServer(New(svc, Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/sandboxes/abc/fs/watch?path=tmp")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	if name, _ := svc.lastCall(); name == "WatchDir" {
		t.Fatal("WatchDir was called")
	}
}
