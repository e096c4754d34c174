package client

import (
	"context"
	"encoding/json"
	"io"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// Watch is a stream of file system events of one watched directory
// (Client.Watch). Next and Close may be called from different
// goroutines; Next from one at a time.
type Watch struct {
	w *wire
}

// Watch watches directory p (with recursive, its subdirectories too) and
// returns once the guest watches it. The stream ends when ctx is done,
// Close is called or the guest ends it (an error: events were lost, or
// the guest went away).
func (c *Client) Watch(ctx context.Context, p string, recursive bool) (*Watch, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	w, err := c.open(ctx, &proto.Request{Op: proto.OpWatch, Path: p, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	if err := w.result(nil); err != nil {
		w.close()
		return nil, err
	}
	return &Watch{w: w}, nil
}

// Next returns the next event; io.EOF when the guest ended the stream
// cleanly.
func (s *Watch) Next() (api.FSEvent, error) {
	t, b, err := s.w.frame()
	if err != nil {
		return api.FSEvent{}, err
	}
	switch t {
	case proto.FrameEOF:
		return api.FSEvent{}, io.EOF
	case proto.FrameResult:
	default:
		return api.FSEvent{}, protoErr("watch: unexpected %s frame", t)
	}
	var ev api.FSEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return api.FSEvent{}, protoErr("watch: undecodable event: %v", err)
	}
	if err := validFSEvent(ev); err != nil {
		return api.FSEvent{}, err
	}
	return ev, nil
}

// Close ends the watch.
func (s *Watch) Close() error { return s.w.close() }

// validFSEvent checks an event from the (untrusted) guest.
func validFSEvent(ev api.FSEvent) error {
	switch ev.Type {
	case api.FSEventCreate, api.FSEventWrite, api.FSEventRemove, api.FSEventRename, api.FSEventChmod:
	default:
		return protoErr("watch: event type %q", ev.Type)
	}
	if checkPath(ev.Path) != nil {
		return protoErr("watch: invalid path in event")
	}
	if ev.Name == "" || len(ev.Name) > proto.MaxPathLen || strings.IndexByte(ev.Name, 0) >= 0 {
		return protoErr("watch: invalid name in event")
	}
	return nil
}
