package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// filesystem.Filesystem WatchDir over Watcher (the guest's inotify).

type watchDirRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
	// IncludeEntry is not supported (envd 0.6.3); EnvdVersion keeps the
	// SDK from asking.
	IncludeEntry bool `json:"includeEntry"`
}

// eventType is filesystem.EventType, sent by name.
type eventType string

type filesystemEvent struct {
	Name string    `json:"name"`
	Type eventType `json:"type"`
}

type watchDirResponse struct {
	Start      *empty           `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *empty           `json:"keepalive,omitempty"`
}

// e2bEventTypes maps agentbox's event types to E2B's.
var e2bEventTypes = map[string]eventType{
	api.FSEventCreate: "EVENT_TYPE_CREATE",
	api.FSEventWrite:  "EVENT_TYPE_WRITE",
	api.FSEventRemove: "EVENT_TYPE_REMOVE",
	api.FSEventRename: "EVENT_TYPE_RENAME",
	api.FSEventChmod:  "EVENT_TYPE_CHMOD",
}

func (s *Server) watchRoutes(mux *http.ServeMux, opts []connect.HandlerOption) {
	mux.Handle(filesystemService+"WatchDir", connect.NewServerStreamHandler(filesystemService+"WatchDir", s.watchDir, opts...))
}

type watchResult struct {
	ev  api.FSEvent
	err error
}

func (s *Server) watchDir(ctx context.Context, req *connect.Request[watchDirRequest], stream *connect.ServerStream[watchDirResponse]) error {
	wt, ok := s.sb.(Watcher)
	if !ok {
		return connectError(fmt.Errorf("watching directories: %w", errdefs.ErrNotImplemented))
	}
	if req.Msg.IncludeEntry {
		return connectError(fmt.Errorf("includeEntry is not supported: %w", errdefs.ErrNotImplemented))
	}
	p, err := fsPath(req.Header(), req.Msg.Path)
	if err != nil {
		return connectError(err)
	}
	evs, err := wt.WatchDir(ctx, sandboxFrom(ctx), p, req.Msg.Recursive)
	if err != nil {
		return connectError(err)
	}
	done := make(chan struct{})
	defer func() {
		close(done)
		evs.Close()
	}()
	if err := stream.Send(&watchDirResponse{Start: &empty{}}); err != nil {
		return err
	}
	results := make(chan watchResult)
	go func() {
		for {
			ev, err := evs.Next()
			select {
			case results <- watchResult{ev, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	interval := keepalive(req.Header())
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		var msg *watchDirResponse
		select {
		case <-ctx.Done():
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-t.C:
			msg = &watchDirResponse{Keepalive: &empty{}}
		case r := <-results:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					return nil
				}
				return connectError(r.err)
			}
			typ, ok := e2bEventTypes[r.ev.Type]
			if !ok {
				continue
			}
			msg = &watchDirResponse{Filesystem: &filesystemEvent{Name: r.ev.Name, Type: typ}}
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		t.Reset(interval)
	}
}
