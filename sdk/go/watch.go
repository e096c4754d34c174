package agentbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/agentbox/agentbox/api"
)

// DirWatch is a stream of the changes under a sandbox directory
// (Sandbox.Watch). Next is called from one goroutine; Close from any.
type DirWatch struct {
	body io.ReadCloser
	dec  *ndjson
	once sync.Once
}

// Watch watches directory path inside the sandbox (with recursive, its
// subdirectories too, those made later included) and returns once it is
// watched: every change made after Watch returns is reported. The stream
// ends when ctx is done, Close is called or the sandbox goes away.
func (s *Sandbox) Watch(ctx context.Context, path string, recursive bool) (*DirWatch, error) {
	q := url.Values{"path": {path}, "recursive": {strconv.FormatBool(recursive)}}
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/fs/watch"), query: q})
	if err != nil {
		return nil, wrapf(err, "watching %s in sandbox %s", path, s.id)
	}
	return &DirWatch{body: resp.Body, dec: newNDJSON(resp.Body)}, nil
}

// watchLine is one line of the stream: an event, or the error that ended
// the watch.
type watchLine struct {
	api.FSEvent
	api.Error
}

// Next returns the next change. At the end of the stream it returns
// io.EOF (closed, or the daemon ended it) or the error the daemon
// reported (a typed *APIError: events were lost, the sandbox is gone).
func (w *DirWatch) Next() (api.FSEvent, error) {
	for {
		var l watchLine
		if err := w.dec.next(&l); err != nil {
			if errors.Is(err, io.EOF) {
				return api.FSEvent{}, io.EOF
			}
			return api.FSEvent{}, err
		}
		if l.Error.Code != "" {
			e := l.Error
			return api.FSEvent{}, streamError(&e)
		}
		if l.FSEvent.Type != "" {
			return l.FSEvent, nil
		}
	}
}

// Close ends the watch.
func (w *DirWatch) Close() error {
	var err error
	w.once.Do(func() { err = w.body.Close() })
	return err
}
