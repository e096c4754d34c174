package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/tracectx"
)

// ndjsonWriter writes one JSON object per line and flushes after each, so
// the client sees every event as soon as it happens.
type ndjsonWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
}

func newNDJSON(w http.ResponseWriter) *ndjsonWriter {
	return &ndjsonWriter{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
}

// write sends v, sending the 200 header first if needed. An error means the
// client is gone.
func (n *ndjsonWriter) write(v any) error {
	if !n.started {
		n.started = true
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.WriteHeader(http.StatusOK)
	}
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

// streamStopKey carries, in the server's base context, a context that is
// cancelled when the daemon begins shutting down (see Server).
type streamStopKey struct{}

// shutdownContext returns the server's stream-stop context, or nil.
func shutdownContext(ctx context.Context) context.Context {
	c, _ := ctx.Value(streamStopKey{}).(context.Context)
	return c
}

// exec runs a command in a sandbox.
//
// Why NDJSON over plain HTTP is the primary exec transport: a chunked
// response of one JSON event per line works with curl and every HTTP
// client, passes through reverse proxies and load balancers that mangle or
// refuse WebSocket upgrades, needs no framing library (an SDK is a line
// reader and a JSON decoder), and keeps the auth, error and request-id rules
// identical to every other route. Input is the one thing that would need a
// full-duplex connection, so it is not carried on the stream at all: stdin,
// resize and signal are separate short requests addressed by pid, and a
// dropped stream is resumed by attach with replay. The process never depends
// on the connection: when the client goes away only the attachment ends.
//
// With background=true no stream is opened: the process is started and
// 201 api.Process is returned at once.
func (h *handler) exec(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var req api.ExecRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validExec(&req); err != nil {
		return err
	}
	// A caller's W3C trace context: the run's span (flight recorder,
	// OpenTelemetry export) becomes a child of it. A malformed one is
	// ignored, as the W3C spec asks.
	ctx := tracectx.WithParent(r.Context(), r.Header.Get("traceparent"))
	if req.Background {
		p, err := h.svc.StartProcess(ctx, id, req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, p)
		return nil
	}
	stream, err := h.svc.Exec(ctx, id, req)
	if err != nil {
		return err
	}
	h.pumpExec(w, r, stream)
	return nil
}

// attach re-attaches to a process's output.
func (h *handler) attach(w http.ResponseWriter, r *http.Request) error {
	id, pid, err := idPid(r)
	if err != nil {
		return err
	}
	replay, err := boolQuery(r, "replay")
	if err != nil {
		return err
	}
	stream, err := h.svc.Attach(r.Context(), id, pid, replay)
	if err != nil {
		return err
	}
	h.pumpExec(w, r, stream)
	return nil
}

// closeWhenDone closes c once: when the request ends, when the daemon
// starts shutting down, or when the returned release is called (the
// handler defers it), whichever is first. Closing from another goroutine
// is what unblocks a pending read of a stream.
func closeWhenDone(r *http.Request, c io.Closer) (release func()) {
	var once sync.Once
	closeC := func() { once.Do(func() { _ = c.Close() }) }
	stops := []func() bool{context.AfterFunc(r.Context(), closeC)}
	if shutdown := shutdownContext(r.Context()); shutdown != nil {
		stops = append(stops, context.AfterFunc(shutdown, closeC))
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
		closeC()
	}
}

// pumpExec copies stream to the client until the final event, the client
// going away, or the daemon shutting down. It always closes stream; closing
// from another goroutine unblocks a pending Next.
func (h *handler) pumpExec(w http.ResponseWriter, r *http.Request, stream execstream.Stream) {
	rs := stateFrom(r.Context())
	defer closeWhenDone(r, stream)()
	shutdown := shutdownContext(r.Context())

	out := newNDJSON(w)
	for {
		ev, err := stream.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !out.started { // an empty stream still answers 200
					w.Header().Set("Content-Type", "application/x-ndjson")
					w.WriteHeader(http.StatusOK)
				}
				return
			}
			if r.Context().Err() != nil {
				rs.err = fmt.Errorf("client went away: %w", r.Context().Err())
				return
			}
			if shutdown != nil && shutdown.Err() != nil {
				err = fmt.Errorf("daemon shutting down; re-attach to the process: %w", errdefs.ErrUnavailable)
			}
			_, pub := publicError(err, rs.id)
			rs.err = err
			_ = out.write(api.ExecEvent{Type: api.EventError, Error: &pub})
			return
		}
		if ev.Error != nil && ev.Error.RequestID == "" {
			ev.Error.RequestID = rs.id
		}
		if err := out.write(ev); err != nil {
			rs.err = fmt.Errorf("writing stream: %w", err)
			return
		}
		if execstream.Final(ev) {
			return
		}
	}
}

// buildTemplate streams the progress of a template build. Errors before the
// first progress event are ordinary JSON error responses; afterwards they
// become the stream's final error event.
func (h *handler) buildTemplate(w http.ResponseWriter, r *http.Request) error {
	var req api.BuildTemplateRequest
	if err := h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if (req.Name == "") == (req.Spec == nil) {
		return errorf("exactly one of name or spec must be set")
	}
	if req.Name != "" && !templateNameRe.MatchString(req.Name) {
		return errorf("invalid template name %q", clip(req.Name))
	}
	rs := stateFrom(r.Context())
	out := newNDJSON(w)
	var (
		mu       sync.Mutex // guards out and done against a misbehaving Service
		done     bool
		writeErr error
	)
	progress := func(ev api.BuildEvent) {
		if ev.Type != api.BuildEventStep && ev.Type != api.BuildEventLog {
			return // the final event is the edge's to send
		}
		mu.Lock()
		defer mu.Unlock()
		if done || writeErr != nil {
			return
		}
		writeErr = out.write(ev)
	}
	t, err := h.svc.BuildTemplate(r.Context(), req, progress)
	mu.Lock()
	defer mu.Unlock()
	done = true
	if err != nil && !out.started {
		return err
	}
	if writeErr != nil {
		rs.err = fmt.Errorf("writing stream: %w", writeErr)
		return nil
	}
	if err != nil {
		_, pub := publicError(err, rs.id)
		rs.err = err
		_ = out.write(api.BuildEvent{Type: api.BuildEventError, Error: &pub})
		return nil
	}
	_ = out.write(api.BuildEvent{Type: api.BuildEventDone, Template: &t})
	return nil
}

// watch streams the changes under a sandbox directory as NDJSON
// api.FSEvent lines until the client goes away, the daemon shuts down or
// the guest ends the watch (then an api.Error line with the reason, when
// it was not a clean end). The first line is written only when a change
// happens; the response header is sent at once, after the directory is
// watched, so a client knows changes from then on are reported.
func (h *handler) watch(ws WatchService, w http.ResponseWriter, r *http.Request) error {
	id, p, err := idPath(r)
	if err != nil {
		return err
	}
	recursive, err := boolQuery(r, "recursive")
	if err != nil {
		return err
	}
	stream, err := ws.WatchDir(r.Context(), id, p, recursive)
	if err != nil {
		return err
	}
	rs := stateFrom(r.Context())
	defer closeWhenDone(r, stream)()
	out := newNDJSON(w)
	out.started = true
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = out.rc.Flush()
	for {
		ev, err := stream.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || r.Context().Err() != nil {
				return nil
			}
			_, pub := publicError(err, rs.id)
			rs.err = err
			_ = out.write(pub)
			return nil
		}
		if err := out.write(ev); err != nil {
			rs.err = fmt.Errorf("writing stream: %w", err)
			return nil
		}
	}
}
