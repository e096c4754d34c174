package test

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// GET /v1/sandboxes/{id}/fs/watch (the Go SDK's Sandbox.Watch) streams what commands inside the
// sandbox do to a directory (recursive: in a new subdirectory too), from
// the sandbox's own inotify, through the real daemon (what is made in a
// new subdirectory before its watch starts is reported too); the watch
// of a deleted sandbox ends.
func TestWatchDirectory(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{Template: "busybox"})
	mustRun(t, sb, "mkdir -p /w")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := sb.Watch(ctx, "/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	events := make(chan api.FSEvent, 100)
	ended := make(chan error, 1)
	go func() {
		defer close(events)
		for {
			ev, err := w.Next()
			if err != nil {
				ended <- err
				return
			}
			events <- ev
		}
	}()
	want := func(typ, name string) {
		t.Helper()
		var seen []api.FSEvent
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("watch ended waiting for %s %s (seen %+v)", typ, name, seen)
				}
				seen = append(seen, ev)
				if ev.Type == typ && ev.Name == name && ev.Path == "/w/"+name {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no %s %s (seen %+v)", typ, name, seen)
			}
		}
	}
	mustRun(t, sb, "echo x > /w/a")
	want(api.FSEventCreate, "a")
	want(api.FSEventWrite, "a")
	mustRun(t, sb, "mv /w/a /w/b")
	want(api.FSEventRename, "a")
	want(api.FSEventCreate, "b")
	mustRun(t, sb, "mkdir /w/sub && touch /w/sub/deep")
	want(api.FSEventCreate, "sub")
	want(api.FSEventCreate, "sub/deep")
	mustRun(t, sb, "rm /w/b")
	want(api.FSEventRemove, "b")
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	for range events { // the stream ends with its sandbox
	}
	if err := <-ended; err == nil {
		t.Error("the watch of a deleted sandbox ended without an error or EOF")
	}
}
