package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
)

// AuditService is implemented by a Service with a flight recorder
// (internal/audit): GET /v1/sandboxes/{id}/events then lists, exports and
// follows its events instead of EventService's.
type AuditService interface {
	// AuditEvents returns sandbox id's recorded events selected by q,
	// oldest first (a deleted sandbox's while its record is kept).
	AuditEvents(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error)
	// FollowAuditEvents calls ready once the sandbox is found, then fn
	// with the recorded events selected by q, then each new one as it is
	// recorded, until ctx ends, fn fails or the sandbox is deleted.
	FollowAuditEvents(ctx context.Context, id string, q api.EventQuery, ready func(), fn func(api.SandboxEvent) error) error
	// VerifyAudit checks sandbox id's record; VerifyAllAudit every record
	// the caller sees.
	VerifyAudit(ctx context.Context, id string) (api.AuditVerifyResult, error)
	VerifyAllAudit(ctx context.Context) ([]api.AuditVerifyResult, error)
}

func (h *handler) auditRoutes() []route {
	as, ok := h.svc.(AuditService)
	if !ok {
		return nil
	}
	a := auditHandlers{svc: as}
	return []route{
		{"GET", "/v1/sandboxes/{id}/events", a.events},
		{"GET", "/v1/sandboxes/{id}/audit/verify", a.verify},
		{"GET", "/v1/audit/verify", listAll(as.VerifyAllAudit, func(l []api.AuditVerifyResult) api.AuditVerifyList {
			return api.AuditVerifyList{Results: l}
		})},
	}
}

type auditHandlers struct{ svc AuditService }

// eventQuery parses the filters of GET .../events.
func eventQuery(r *http.Request) (api.EventQuery, error) {
	v := r.URL.Query()
	var q api.EventQuery
	for _, t := range v["type"] {
		for _, s := range strings.Split(t, ",") {
			if s = strings.TrimSpace(s); s != "" {
				if len(s) > 64 {
					return q, errorf("type %q is too long", clip(s))
				}
				q.Types = append(q.Types, s)
			}
		}
	}
	if len(q.Types) > 32 {
		return q, errorf("at most 32 types")
	}
	q.Run = v.Get("run")
	if len(q.Run) > 128 {
		return q, errorf("run %q is too long", clip(q.Run))
	}
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if s := v.Get(p.name); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return q, errorf("%s %q: want an RFC 3339 time", p.name, clip(s))
			}
			*p.t = t
		}
	}
	after := v.Get("after")
	if after == "" {
		after = r.Header.Get("Last-Event-ID")
	}
	if after != "" {
		n, err := strconv.ParseUint(after, 10, 64)
		if err != nil {
			return q, errorf("after %q: want a sequence number", clip(after))
		}
		q.After = n
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, errorf("limit %q: want a number", clip(s))
		}
		q.Limit = n
	}
	return q, nil
}

// events lists a sandbox's events as one JSON document, exports them as
// JSON lines (?format=jsonl or Accept: application/x-ndjson) or follows
// them (?follow=1, or Accept: text/event-stream: server-sent events, each
// with its sequence number as id; JSON lines when asked for with follow).
func (a auditHandlers) events(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	q, err := eventQuery(r)
	if err != nil {
		return err
	}
	accept := r.Header.Get("Accept")
	sse := strings.Contains(accept, "text/event-stream")
	jsonl := r.URL.Query().Get("format") == "jsonl" || strings.Contains(accept, "application/x-ndjson")
	follow := sse || isTrue(r.URL.Query().Get("follow"))
	if !follow {
		evs, err := a.svc.AuditEvents(r.Context(), id, q)
		if err != nil {
			return err
		}
		if evs == nil {
			evs = []api.SandboxEvent{}
		}
		if !jsonl {
			writeJSON(w, http.StatusOK, api.SandboxEventList{Events: evs})
			return nil
		}
		out := newNDJSON(w)
		for _, ev := range evs {
			if err := out.write(ev); err != nil {
				return nil // the client is gone
			}
		}
		if !out.started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if shutdown := shutdownContext(r.Context()); shutdown != nil {
		stop := context.AfterFunc(shutdown, cancel)
		defer stop()
	}
	var write func(api.SandboxEvent) error
	started := false
	start := func() {
		if started {
			return
		}
		started = true
		if sse || !jsonl {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-store")
		} else {
			w.Header().Set("Content-Type", "application/x-ndjson")
		}
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
	}
	rc := http.NewResponseController(w)
	if sse || !jsonl {
		write = func(ev api.SandboxEvent) error {
			start()
			b, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := w.Write([]byte("id: " + strconv.FormatUint(ev.Seq, 10) + "\nevent: " + ev.Type + "\ndata: ")); err != nil {
				return err
			}
			if _, err := w.Write(append(b, '\n', '\n')); err != nil {
				return err
			}
			return rc.Flush()
		}
	} else {
		enc := json.NewEncoder(w)
		write = func(ev api.SandboxEvent) error {
			start()
			if err := enc.Encode(ev); err != nil {
				return err
			}
			return rc.Flush()
		}
	}
	// The header goes out once the sandbox is found (an error before is
	// a normal error response), so the client knows it is following even
	// before an event.
	err = a.svc.FollowAuditEvents(ctx, id, q, start, write)
	if err != nil && !started {
		return err
	}
	start()
	return nil
}

func isTrue(s string) bool {
	b, err := strconv.ParseBool(s)
	return err == nil && b
}

func (a auditHandlers) verify(w http.ResponseWriter, r *http.Request) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	res, err := a.svc.VerifyAudit(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
