package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// The fake service implements the pipeline's optional interfaces, so their
// routes are registered (and checked against the spec) in every test.
var (
	_ RunService      = (*fakeService)(nil)
	_ ScheduleService = (*fakeService)(nil)
	_ HookService     = (*fakeService)(nil)
)

const (
	fakeSched = "sch_0123456789abcdef0123"
	fakeHook  = "hook_0123456789abcdef0123"
	fakeRun   = "run_0123456789abcdef0123"
)

func (f *fakeService) ListRuns(ctx context.Context, sandbox, trigger string, limit int) ([]api.Run, error) {
	return nil, f.call("ListRuns", sandbox, trigger, limit, CallerFrom(ctx))
}

func (f *fakeService) GetRun(ctx context.Context, id string) (api.Run, error) {
	return api.Run{ID: id, Trigger: api.TriggerAPI}, f.call("GetRun", id)
}

func (f *fakeService) Usage(ctx context.Context, sandbox string, since time.Time) (api.Usage, error) {
	return api.Usage{Tenants: []api.TenantUsage{}, Sandboxes: []api.SandboxUsage{}}, f.call("Usage", sandbox, since)
}

func (f *fakeService) ExportUsage(ctx context.Context, sandbox string, since time.Time, emit func(api.UsageRecord) error) error {
	if err := f.call("ExportUsage", sandbox, since); err != nil {
		return err
	}
	for _, id := range []string{"r1", "r2"} {
		if err := emit(api.UsageRecord{Run: id, Trigger: api.TriggerAPI}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeService) CreateSchedule(ctx context.Context, req api.CreateScheduleRequest) (api.Schedule, error) {
	return api.Schedule{ID: fakeSched, Cron: req.Cron, RunAction: req.RunAction}, f.call("CreateSchedule", req)
}

func (f *fakeService) ListSchedules(ctx context.Context) ([]api.Schedule, error) {
	return nil, f.call("ListSchedules")
}

func (f *fakeService) GetSchedule(ctx context.Context, id string) (api.Schedule, error) {
	return api.Schedule{ID: id}, f.call("GetSchedule", id)
}

func (f *fakeService) DeleteSchedule(ctx context.Context, id string) error {
	return f.call("DeleteSchedule", id)
}

func (f *fakeService) TriggerSchedule(ctx context.Context, id string) (api.Run, error) {
	return api.Run{ID: fakeRun, Trigger: api.TriggerSchedule}, f.call("TriggerSchedule", id)
}

func (f *fakeService) CreateHook(ctx context.Context, req api.CreateHookRequest) (api.Hook, error) {
	return api.Hook{ID: fakeHook, Secret: "whsec_x", RunAction: req.RunAction}, f.call("CreateHook", req)
}

func (f *fakeService) ListHooks(ctx context.Context) ([]api.Hook, error) {
	return nil, f.call("ListHooks")
}

func (f *fakeService) GetHook(ctx context.Context, id string) (api.Hook, error) {
	return api.Hook{ID: id}, f.call("GetHook", id)
}

func (f *fakeService) DeleteHook(ctx context.Context, id string) error {
	return f.call("DeleteHook", id)
}

func (f *fakeService) InvokeHook(ctx context.Context, id, ts, sig string, body []byte, wait bool) (api.Run, error) {
	if sig != "sha256=good" {
		return api.Run{}, fmt.Errorf("invalid webhook signature: %w", errdefs.ErrUnauthenticated)
	}
	return api.Run{ID: fakeRun, Trigger: api.TriggerWebhook}, f.call("InvokeHook", id, ts, sig, string(body), wait)
}

func TestPipelineRoutes(t *testing.T) {
	cases := []struct {
		method, path, body string
		status             int
		call               string
		args               []any
	}{
		{"GET", "/v1/runs", ``, 200, "ListRuns", []any{"", "", 100, "unix-socket"}},
		{"GET", "/v1/runs?sandbox=sb1&trigger=webhook&limit=5", ``, 200, "ListRuns", []any{"sb1", "webhook", 5, "unix-socket"}},
		{"GET", "/v1/runs?trigger=cron", ``, 400, "", nil},
		{"GET", "/v1/runs?limit=0", ``, 400, "", nil},
		{"GET", "/v1/runs?sandbox=../x", ``, 400, "", nil},
		{"GET", "/v1/runs/" + fakeRun, ``, 200, "GetRun", []any{fakeRun}},
		{"GET", "/v1/runs/nope", ``, 400, "", nil},
		{"GET", "/v1/usage?sandbox=sb1&since=2030-01-01T00:00:00Z", ``, 200, "Usage", []any{"sb1", time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}},
		{"GET", "/v1/usage?since=yesterday", ``, 400, "", nil},
		{"POST", "/v1/schedules", `{"cron":"0 9 * * 1","timezone":"Europe/Paris","template":"t","name":"n","lifecycle":"persistent","cmd":["echo","hi"]}`, 201, "CreateSchedule",
			[]any{api.CreateScheduleRequest{Cron: "0 9 * * 1", Timezone: "Europe/Paris", RunAction: api.RunAction{Template: "t", Name: "n", Lifecycle: "persistent", Cmd: []string{"echo", "hi"}}}}},
		{"POST", "/v1/schedules", `{"cron":"* * * * *","action":{}}`, 400, "", nil},
		{"POST", "/v1/schedules", `{"cron":"* * * * *","command":"x","cwd":"rel"}`, 400, "", nil},
		{"POST", "/v1/schedules", `{"cron":"* * * * *","command":"x","env":{"A=B":"1"}}`, 400, "", nil},
		{"GET", "/v1/schedules", ``, 200, "ListSchedules", []any{}},
		{"GET", "/v1/schedules/" + fakeSched, ``, 200, "GetSchedule", []any{fakeSched}},
		{"GET", "/v1/schedules/SCH", ``, 400, "", nil},
		{"DELETE", "/v1/schedules/" + fakeSched, ``, 204, "DeleteSchedule", []any{fakeSched}},
		{"POST", "/v1/schedules/" + fakeSched + "/trigger", ``, 200, "TriggerSchedule", []any{fakeSched}},
		{"POST", "/v1/hooks", `{"template":"t","command":"cat"}`, 201, "CreateHook", []any{api.CreateHookRequest{RunAction: api.RunAction{Template: "t", Command: "cat"}}}},
		{"GET", "/v1/hooks", ``, 200, "ListHooks", []any{}},
		{"GET", "/v1/hooks/" + fakeHook, ``, 200, "GetHook", []any{fakeHook}},
		{"DELETE", "/v1/hooks/" + fakeHook, ``, 204, "DeleteHook", []any{fakeHook}},
	}
	for _, c := range cases {
		f := &fakeService{}
		h, _ := newTestHandler(t, f, Options{})
		rec := do(h, c.method, c.path, c.body, "Content-Type", "application/json")
		if rec.Code != c.status {
			t.Errorf("%s %s: %d %s", c.method, c.path, rec.Code, rec.Body)
			continue
		}
		name, args := f.lastCall()
		if name != c.call {
			t.Errorf("%s %s: called %q, want %q", c.method, c.path, name, c.call)
			continue
		}
		if c.args != nil && !reflect.DeepEqual(args, c.args) && !(len(args) == 0 && len(c.args) == 0) {
			t.Errorf("%s %s: args %#v, want %#v", c.method, c.path, args, c.args)
		}
	}
}

func TestUsageExportIsNDJSON(t *testing.T) {
	h, _ := newTestHandler(t, &fakeService{}, Options{})
	rec := do(h, "GET", "/v1/usage/export", "")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	lines := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines %q", lines)
	}
	for _, l := range lines {
		var r api.UsageRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Run == "" {
			t.Fatalf("line %q: %v", l, err)
		}
	}
}

// On TCP, a webhook delivery needs no API key (its signature is checked
// by the service), and nothing else is exempted: not the hook management
// routes, not look-alike paths.
func TestHookDeliveryAuthExemption(t *testing.T) {
	const key = "k-0123456789abcdef"
	f := &fakeService{}
	h, _ := newTestHandler(t, f, Options{RequireAuth: true, APIKeys: []string{key}, AllowedHosts: []string{"example.com"}})
	hdr := []string{"X-Agentbox-Timestamp", "1", "X-Agentbox-Signature", "sha256=good"}
	rec := do(h, "POST", "/v1/hooks/"+fakeHook+"?wait=true", "payload", hdr...)
	if rec.Code != 200 {
		t.Fatalf("signed delivery without key: %d %s", rec.Code, rec.Body)
	}
	if name, args := f.lastCall(); name != "InvokeHook" || args[3] != "payload" || args[4] != true {
		t.Fatalf("call %s %v", name, args)
	}
	if rec := do(h, "POST", "/v1/hooks/"+fakeHook, "payload", hdr...); rec.Code != 202 {
		t.Fatalf("async delivery: %d", rec.Code)
	}
	bad := []string{"X-Agentbox-Timestamp", "1", "X-Agentbox-Signature", "sha256=bad"}
	if rec := do(h, "POST", "/v1/hooks/"+fakeHook, "payload", bad...); rec.Code != 401 {
		t.Fatalf("bad signature: %d", rec.Code)
	}
	f.calls = nil
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/hooks"},
		{"GET", "/v1/hooks"},
		{"GET", "/v1/hooks/" + fakeHook},
		{"DELETE", "/v1/hooks/" + fakeHook},
		{"POST", "/v1/hooks/" + fakeHook + "/x"},
		{"POST", "/v1/hooks/" + fakeHook + "/../../sandboxes"},
		{"POST", "/v1/hooks/" + fakeHook + "%2F..%2F..%2Fsandboxes"},
		{"POST", "/v1/schedules/" + fakeSched + "/trigger"},
		{"GET", "/v1/runs"},
	} {
		if rec := do(h, c.method, c.path, `{"command":"x"}`, hdr...); rec.Code != 401 {
			t.Errorf("%s %s without key: %d", c.method, c.path, rec.Code)
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("unauthenticated requests reached the service: %v", f.calls)
	}
	// Host checks still apply to deliveries.
	req := do(h, "POST", "/v1/hooks/"+fakeHook, "payload", append(hdr, "Origin", "http://evil.example")...)
	if req.Code != 403 {
		t.Fatalf("cross-origin delivery: %d", req.Code)
	}
	// The caller of a keyed request is its key's id, never the key.
	if rec := do(h, "GET", "/v1/runs", "", "Authorization", "Bearer "+key); rec.Code != 200 {
		t.Fatalf("keyed: %d", rec.Code)
	}
	_, args := f.lastCall()
	who, _ := args[3].(string)
	if !strings.HasPrefix(who, "api-key:") || len(who) != len("api-key:")+12 || strings.Contains(who, key) {
		t.Fatalf("caller %q", who)
	}
}

// Every JSON field of the pipeline's wire types (embedded structs
// flattened) is a property of the schema of the same name and vice versa.
func TestOpenAPIPipelineSchemas(t *testing.T) {
	checkSchemaFields(t, loadSpec(t),
		api.Run{}, api.RunUsage{}, api.RunList{}, api.UsageTotals{}, api.SandboxUsage{}, api.TenantUsage{}, api.Usage{},
		api.UsageRecord{}, api.RunAction{}, api.CreateScheduleRequest{}, api.Schedule{}, api.ScheduleList{},
		api.CreateHookRequest{}, api.Hook{}, api.HookList{},
	)
}
