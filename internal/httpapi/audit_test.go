package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
)

func (f *fakeService) auditEvents(id string) []api.SandboxEvent {
	return []api.SandboxEvent{
		{Time: t0, SandboxID: id, RunID: "r", Type: "log", Message: "hi", Seq: 1},
		{Time: t0, SandboxID: id, RunID: "r2", Type: api.EventRunStarted, Seq: 2, Run: &api.RunEvent{Command: "ls"}},
	}
}

func (f *fakeService) AuditEvents(ctx context.Context, id string, q api.EventQuery) ([]api.SandboxEvent, error) {
	if err := f.call("AuditEvents", id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.lastQuery = q
	f.mu.Unlock()
	var out []api.SandboxEvent
	for _, ev := range f.auditEvents(id) {
		if q.Match(ev) {
			out = append(out, ev)
		}
	}
	return out, nil
}

func (f *fakeService) FollowAuditEvents(ctx context.Context, id string, q api.EventQuery, ready func(), fn func(api.SandboxEvent) error) error {
	if err := f.call("FollowAuditEvents", id); err != nil {
		return err
	}
	ready()
	for _, ev := range f.auditEvents(id) {
		if q.Match(ev) {
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *fakeService) VerifyAudit(ctx context.Context, id string) (api.AuditVerifyResult, error) {
	if err := f.call("VerifyAudit", id); err != nil {
		return api.AuditVerifyResult{}, err
	}
	return api.AuditVerifyResult{SandboxID: id, OK: true, Events: 2}, nil
}

func (f *fakeService) VerifyAllAudit(ctx context.Context) ([]api.AuditVerifyResult, error) {
	if err := f.call("VerifyAllAudit", ""); err != nil {
		return nil, err
	}
	return []api.AuditVerifyResult{{SandboxID: "sb1", OK: false, Problem: "edited"}}, nil
}

func TestEventsRouteFilters(t *testing.T) {
	f := &fakeService{}
	h := New(f, Options{})
	get := func(target string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", target, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	w := get("/v1/sandboxes/sb1/events?type=run,file.changed&type=network&run=r2&since=2026-01-01T00:00:00Z&after=1&limit=5")
	var list api.SandboxEventList
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || w.Code != 200 || len(list.Events) != 1 || list.Events[0].Type != api.EventRunStarted {
		t.Fatalf("filtered: %d %s", w.Code, w.Body)
	}
	q := f.lastQuery
	if strings.Join(q.Types, " ") != "run file.changed network" || q.Run != "r2" || q.After != 1 || q.Limit != 5 || q.Since.IsZero() {
		t.Fatalf("query %+v", q)
	}
	for _, bad := range []string{"since=yesterday", "after=-1", "limit=x", "until=1"} {
		if w := get("/v1/sandboxes/sb1/events?" + bad); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", bad, w.Code)
		}
	}
	// Export as JSON lines.
	w = get("/v1/sandboxes/sb1/events?format=jsonl")
	if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" || strings.Count(w.Body.String(), "\n") != 2 {
		t.Fatalf("jsonl: %s %q", ct, w.Body)
	}
	// Follow as server-sent events, resumed after Last-Event-ID.
	w = get("/v1/sandboxes/sb1/events", "Accept", "text/event-stream", "Last-Event-ID", "1")
	if ct := w.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("sse content type %q", ct)
	}
	sc := bufio.NewScanner(strings.NewReader(w.Body.String()))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 4 || lines[0] != "id: 2" || lines[1] != "event: run.started" || !strings.HasPrefix(lines[2], "data: {") || lines[3] != "" {
		t.Fatalf("sse: %q", lines)
	}
	// Follow as JSON lines.
	w = get("/v1/sandboxes/sb1/events?follow=1&format=jsonl")
	if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" || strings.Count(w.Body.String(), "\n") != 2 {
		t.Fatalf("follow jsonl: %s %q", ct, w.Body)
	}
	// Verify.
	w = get("/v1/sandboxes/sb1/audit/verify")
	var res api.AuditVerifyResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || !res.OK || res.SandboxID != "sb1" {
		t.Fatalf("verify: %d %s", w.Code, w.Body)
	}
	w = get("/v1/audit/verify")
	var all api.AuditVerifyList
	if err := json.Unmarshal(w.Body.Bytes(), &all); err != nil || len(all.Results) != 1 || all.Results[0].OK {
		t.Fatalf("verify all: %d %s", w.Code, w.Body)
	}
}

// The wire types of the flight recorder match their schemas.
func TestOpenAPIAuditSchemas(t *testing.T) {
	checkSchemaFields(t, loadSpec(t), api.RunEvent{}, api.FileEvent{}, api.PackageEvent{}, api.DroppedEvents{}, api.AuditVerifyResult{}, api.AuditVerifyList{})
}
