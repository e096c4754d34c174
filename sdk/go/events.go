package agentbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/api"
)

// The flight recorder (docs/AUDIT.md): every event of a sandbox, queried,
// exported, followed and verified.

type (
	// EventQuery selects events: types ("run" selects run.started and
	// run.ended), a run, a time range, events after a sequence number, a
	// limit.
	EventQuery = api.EventQuery
	// AuditVerifyResult is the outcome of verifying one sandbox's record.
	AuditVerifyResult = api.AuditVerifyResult
)

func queryValues(q EventQuery) url.Values {
	v := url.Values{}
	if len(q.Types) > 0 {
		v.Set("type", strings.Join(q.Types, ","))
	}
	if q.Run != "" {
		v.Set("run", q.Run)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// QueryEvents returns the sandbox's recorded events selected by q, oldest
// first. A deleted sandbox's record stays readable for the daemon's
// retention period.
func (s *Sandbox) QueryEvents(ctx context.Context, q EventQuery) ([]SandboxEvent, error) {
	var list api.SandboxEventList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/events"), query: queryValues(q)}, &list); err != nil {
		return nil, wrapf(err, "listing events of sandbox %s", s.id)
	}
	return list.Events, nil
}

// ExportEvents writes the sandbox's events selected by q to w as JSON
// lines, one event per line, as the daemon sends them.
func (s *Sandbox) ExportEvents(ctx context.Context, q EventQuery, w io.Writer) error {
	v := queryValues(q)
	v.Set("format", "jsonl")
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/events"), query: v})
	if err != nil {
		return wrapf(err, "exporting events of sandbox %s", s.id)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return wrapf(err, "exporting events of sandbox %s", s.id)
	}
	return nil
}

// EventStream is a followed sandbox's events (FollowEvents).
type EventStream struct {
	body io.ReadCloser
	dec  *ndjson
	once sync.Once
}

// Next returns the next event; io.EOF once the sandbox is deleted (its
// delete event came before) or the daemon ended the stream.
func (e *EventStream) Next() (SandboxEvent, error) {
	var ev SandboxEvent
	err := e.dec.next(&ev)
	if errors.Is(err, io.EOF) {
		return ev, io.EOF
	}
	return ev, err
}

// Close ends the stream.
func (e *EventStream) Close() error {
	var err error
	e.once.Do(func() { err = e.body.Close() })
	return err
}

// FollowEvents returns the sandbox's recorded events selected by q, then
// each new one as it is recorded, until ctx ends, the stream is closed or
// the sandbox is deleted.
func (s *Sandbox) FollowEvents(ctx context.Context, q EventQuery) (*EventStream, error) {
	v := queryValues(q)
	v.Set("follow", "1")
	v.Set("format", "jsonl")
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/events"), query: v})
	if err != nil {
		return nil, wrapf(err, "following events of sandbox %s", s.id)
	}
	return &EventStream{body: resp.Body, dec: newNDJSON(resp.Body)}, nil
}

// VerifyAudit checks the sandbox's record: its hash chain and the daemon's
// signed heads. A record that does not verify is a result with OK false
// and the problem named, not an error.
func (s *Sandbox) VerifyAudit(ctx context.Context) (AuditVerifyResult, error) {
	var res AuditVerifyResult
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/audit/verify")}, &res); err != nil {
		return res, wrapf(err, "verifying the record of sandbox %s", s.id)
	}
	return res, nil
}

// VerifyAudit checks the record of every sandbox the caller sees (deleted
// ones within their retention included).
func (c *Client) VerifyAudit(ctx context.Context) ([]AuditVerifyResult, error) {
	var list api.AuditVerifyList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/audit/verify"}, &list); err != nil {
		return nil, wrapf(err, "verifying records")
	}
	return list.Results, nil
}

type traceParentKey struct{}

// WithTraceParent returns ctx whose requests carry traceparent, a W3C
// trace context ("00-<trace id>-<span id>-<flags>"): an exec made with it
// is recorded as a span that is a child of the caller's span, in the
// daemon's OpenTelemetry export (serve --otlp-endpoint).
func WithTraceParent(ctx context.Context, traceparent string) context.Context {
	return context.WithValue(ctx, traceParentKey{}, traceparent)
}
