package guest_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/guest/client"
)

// nextEvent reads events of w until one matches want, failing after a
// while (inotify may report extra events, e.g. a write after a create).
func nextEvent(t *testing.T, w *client.Watch, want api.FSEvent) {
	t.Helper()
	got := make(chan api.FSEvent, 64)
	errc := make(chan error, 1)
	go func() {
		for {
			ev, err := w.Next()
			if err != nil {
				errc <- err
				return
			}
			got <- ev
			if ev == want {
				return
			}
		}
	}()
	var seen []api.FSEvent
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-got:
			seen = append(seen, ev)
			if ev == want {
				return
			}
		case err := <-errc:
			t.Fatalf("watch ended waiting for %+v: %v (seen %+v)", want, err, seen)
		case <-deadline:
			t.Fatalf("no %+v (seen %+v)", want, seen)
		}
	}
}

// Watch reports create, write, chmod, rename and remove under a
// directory, in new subdirectories of a recursive watch too, from the
// moment it returns.
func TestWatch(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	dir := t.TempDir()
	w, err := c.Watch(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(a, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventCreate, Path: a, Name: "a"})
	nextEvent(t, w, api.FSEvent{Type: api.FSEventWrite, Path: a, Name: "a"})
	if err := os.Chmod(a, 0o600); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventChmod, Path: a, Name: "a"})
	b := filepath.Join(dir, "b")
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventRename, Path: a, Name: "a"})
	nextEvent(t, w, api.FSEvent{Type: api.FSEventCreate, Path: b, Name: "b"})
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventCreate, Path: sub, Name: "sub"})
	deep := filepath.Join(sub, "deep")
	if err := os.WriteFile(deep, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventCreate, Path: deep, Name: "sub/deep"})
	// What is made with a new directory, before its watch can start, is
	// reported too.
	tree := filepath.Join(dir, "t1")
	if err := os.MkdirAll(filepath.Join(tree, "t2", "t3"), 0o755); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventCreate, Path: filepath.Join(tree, "t2", "t3"), Name: "t1/t2/t3"})
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, w, api.FSEvent{Type: api.FSEventRemove, Path: b, Name: "b"})
}

// A watch of a file or of a missing path is refused.
func TestWatchRefusesNonDirectories(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Watch(ctx, f, false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("watch of a file: %v, want invalid argument", err)
	}
	if _, err := c.Watch(ctx, filepath.Join(f, "missing"), false); err == nil {
		t.Error("watch of a missing path succeeded")
	}
	if _, err := c.Watch(ctx, "relative", false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("watch of a relative path: %v, want invalid argument", err)
	}
}
