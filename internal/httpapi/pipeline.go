package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// The execution pipeline's routes: run records, usage, schedules and
// webhooks (see internal/pipeline). Each group is an optional service.

// RunService is implemented by a Service that records runs; its routes
// exist only then. The contract of Service applies.
type RunService interface {
	// ListRuns returns the run records of sandbox and trigger ("" for
	// any), newest first, at most limit (0: a default cap).
	ListRuns(ctx context.Context, sandbox, trigger string, limit int) ([]api.Run, error)
	// GetRun returns one run record (ErrNotFound).
	GetRun(ctx context.Context, id string) (api.Run, error)
	// Usage sums the runs of sandbox ("" for all) started at or after
	// since (zero: all).
	Usage(ctx context.Context, sandbox string, since time.Time) (api.Usage, error)
	// ExportUsage calls emit once per finished run, oldest first; an
	// error from emit (the client went away) ends the export.
	ExportUsage(ctx context.Context, sandbox string, since time.Time, emit func(api.UsageRecord) error) error
}

// ScheduleService is implemented by a Service with cron schedules.
type ScheduleService interface {
	CreateSchedule(ctx context.Context, req api.CreateScheduleRequest) (api.Schedule, error)
	ListSchedules(ctx context.Context) ([]api.Schedule, error)
	GetSchedule(ctx context.Context, id string) (api.Schedule, error)
	DeleteSchedule(ctx context.Context, id string) error
	// TriggerSchedule runs a schedule now, on the same path as a cron
	// slot, and returns the finished run.
	TriggerSchedule(ctx context.Context, id string) (api.Run, error)
}

// HookService is implemented by a Service with webhooks.
type HookService interface {
	// CreateHook returns the new hook with its secret (shown only here).
	CreateHook(ctx context.Context, req api.CreateHookRequest) (api.Hook, error)
	ListHooks(ctx context.Context) ([]api.Hook, error)
	GetHook(ctx context.Context, id string) (api.Hook, error)
	DeleteHook(ctx context.Context, id string) error
	// InvokeHook authenticates a delivery by its signature (ErrUnauthenticated;
	// ErrConflict for a replay) and starts the hook's run with body as
	// stdin; with wait it returns the finished run, else the running one.
	InvokeHook(ctx context.Context, id, timestamp, signature string, body []byte, wait bool) (api.Run, error)
}

const (
	defaultRunLimit = 100
	maxRunLimit     = 10_000
)

var (
	runIDRe     = lazyregexp.New(`^run_[0-9a-f]{16,40}$`)
	triggerIDRe = lazyregexp.New(`^[a-z]{1,8}_[0-9a-f]{16,32}$`)
)

// Caller identities (api.Run.Who of API runs).
const callerUnixSocket = "unix-socket"

type callerKey struct{}

// CallerFrom returns the identity of the caller of the request ctx belongs
// to: "unix-socket" (the trusted socket), "api-key:<first 12 hex digits of
// the key's SHA-256>" for a key of the daemon's keys file,
// "tenant:<id>/key:<key id>" for a tenant's key, "" outside a request.
func CallerFrom(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}

// isHookDelivery reports whether r is a webhook delivery: POST
// /v1/hooks/{id} with a well-formed id, served only when the Service has
// hooks. Such requests are authenticated by their signature, not by an
// API key (the sender is a third party that holds only the hook's
// secret); Host and Origin checks still apply.
func (h *handler) isHookDelivery(r *http.Request) bool {
	if _, ok := h.svc.(HookService); !ok || r.Method != http.MethodPost {
		return false
	}
	const prefix = "/v1/hooks/"
	p := r.URL.Path
	return len(p) > len(prefix) && p[:len(prefix)] == prefix && triggerIDRe.MatchString(p[len(prefix):])
}

// pipelineRoutes are the routes of RunService, ScheduleService and
// HookService, for those svc implements.
func (h *handler) pipelineRoutes() []route {
	var rts []route
	if rs, ok := h.svc.(RunService); ok {
		x := runHandlers{h: h, svc: rs}
		rts = append(rts,
			route{"GET", "/v1/runs", x.list},
			route{"GET", "/v1/runs/{run}", x.get},
			route{"GET", "/v1/usage", x.usage},
			route{"GET", "/v1/usage/export", x.export},
		)
	}
	if ss, ok := h.svc.(ScheduleService); ok {
		x := scheduleHandlers{h: h, svc: ss}
		rts = append(rts,
			route{"POST", "/v1/schedules", x.create},
			route{"GET", "/v1/schedules", listAll(ss.ListSchedules, func(l []api.Schedule) api.ScheduleList { return api.ScheduleList{Schedules: l} })},
			route{"GET", "/v1/schedules/{sid}", byID("schedule", http.StatusOK, ss.GetSchedule)},
			route{"DELETE", "/v1/schedules/{sid}", deleteByID("schedule", ss.DeleteSchedule)},
			route{"POST", "/v1/schedules/{sid}/trigger", byID("schedule", http.StatusOK, ss.TriggerSchedule)},
		)
	}
	if hs, ok := h.svc.(HookService); ok {
		x := hookHandlers{h: h, svc: hs}
		rts = append(rts,
			route{"POST", "/v1/hooks", x.create},
			route{"GET", "/v1/hooks", listAll(hs.ListHooks, func(l []api.Hook) api.HookList { return api.HookList{Hooks: l} })},
			route{"GET", "/v1/hooks/{sid}", byID("hook", http.StatusOK, hs.GetHook)},
			route{"DELETE", "/v1/hooks/{sid}", deleteByID("hook", hs.DeleteHook)},
			route{"POST", "/v1/hooks/{sid}", x.deliver},
		)
	}
	return rts
}

type runHandlers struct {
	h   *handler
	svc RunService
}

func (x runHandlers) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	sb, trig := q.Get("sandbox"), q.Get("trigger")
	if sb != "" && !sandboxIDRe.MatchString(sb) {
		return errorf("invalid sandbox id %q", clip(sb))
	}
	if sb != "" {
		sb = resolveSandbox(r, sb)
	}
	switch trig {
	case "", api.TriggerAPI, api.TriggerSchedule, api.TriggerWebhook, api.TriggerMCP, api.TriggerE2B, api.TriggerReplay:
	default:
		return errorf("unknown trigger %q (api, schedule, webhook, mcp, e2b, replay)", clip(trig))
	}
	limit := defaultRunLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > maxRunLimit {
			return errorf("limit must be an integer from 1 to %d", maxRunLimit)
		}
		limit = n
	}
	runs, err := x.svc.ListRuns(r.Context(), sb, trig, limit)
	if err != nil {
		return err
	}
	if runs == nil {
		runs = []api.Run{}
	}
	writeJSON(w, http.StatusOK, api.RunList{Runs: runs})
	return nil
}

func (x runHandlers) get(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("run")
	if !runIDRe.MatchString(id) {
		return errorf("invalid run id %q", clip(id))
	}
	run, err := x.svc.GetRun(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, run)
	return nil
}

// usageQuery parses ?sandbox=&since= (since: RFC 3339, or a duration
// back from now such as 24h).
func usageQuery(r *http.Request) (string, time.Time, error) {
	q := r.URL.Query()
	sb := q.Get("sandbox")
	if sb != "" && !sandboxIDRe.MatchString(sb) {
		return "", time.Time{}, errorf("invalid sandbox id %q", clip(sb))
	}
	if sb != "" {
		sb = resolveSandbox(r, sb)
	}
	var since time.Time
	if s := q.Get("since"); s != "" {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			since = t
		} else if d, err := time.ParseDuration(s); err == nil && d > 0 {
			since = time.Now().Add(-d)
		} else {
			return "", time.Time{}, errorf("since must be an RFC 3339 time or a positive duration like 24h")
		}
	}
	return sb, since, nil
}

func (x runHandlers) usage(w http.ResponseWriter, r *http.Request) error {
	sb, since, err := usageQuery(r)
	if err != nil {
		return err
	}
	u, err := x.svc.Usage(r.Context(), sb, since)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}

func (x runHandlers) export(w http.ResponseWriter, r *http.Request) error {
	sb, since, err := usageQuery(r)
	if err != nil {
		return err
	}
	out := newNDJSON(w)
	err = x.svc.ExportUsage(r.Context(), sb, since, func(rec api.UsageRecord) error { return out.write(rec) })
	if err != nil {
		// Half-sent, handle cuts the response so the client sees it
		// incomplete.
		return err
	}
	if !out.started {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
	return nil
}

// triggerID returns the validated {sid} path value of a schedule or hook.
func triggerID(r *http.Request, what string) (string, error) {
	id := r.PathValue("sid")
	if !triggerIDRe.MatchString(id) {
		return "", errorf("invalid %s id %q", what, clip(id))
	}
	return id, nil
}

// byID serves a call whose only argument is the {sid} path value of a
// schedule or hook, answering its result as JSON with status.
func byID[T any](what string, status int, call func(context.Context, string) (T, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := triggerID(r, what)
		if err != nil {
			return err
		}
		v, err := call(r.Context(), id)
		if err != nil {
			return err
		}
		writeJSON(w, status, v)
		return nil
	}
}

// deleteByID serves a delete of the schedule or hook named by {sid}: 204.
func deleteByID(what string, call func(context.Context, string) error) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := triggerID(r, what)
		if err != nil {
			return err
		}
		if err := call(r.Context(), id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// validAction checks the shape of a schedule's or hook's action.
func validAction(a *api.RunAction) error {
	if err := noNUL("action", append([]string{a.Template, a.Name, a.Lifecycle, a.Command, a.Cwd}, a.Cmd...)...); err != nil {
		return err
	}
	if a.Cwd != "" {
		if err := validPath("cwd", a.Cwd); err != nil {
			return err
		}
	}
	return validEnv("env", a.Env)
}

type scheduleHandlers struct {
	h   *handler
	svc ScheduleService
}

func (x scheduleHandlers) create(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateScheduleRequest
	if err := x.h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validAction(&req.RunAction); err != nil {
		return err
	}
	if err := noNUL("schedule", req.Cron, req.Timezone, req.MissedRunPolicy); err != nil {
		return err
	}
	s, err := x.svc.CreateSchedule(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s)
	return nil
}

type hookHandlers struct {
	h   *handler
	svc HookService
}

func (x hookHandlers) create(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateHookRequest
	if err := x.h.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := validAction(&req.RunAction); err != nil {
		return err
	}
	hk, err := x.svc.CreateHook(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, hk)
	return nil
}

// deliver is a webhook delivery: the raw body (at most MaxBodyBytes) is
// what the signature covers and what the command reads on stdin. 202 with
// the running record, or 200 with the finished one when ?wait=true.
func (x hookHandlers) deliver(w http.ResponseWriter, r *http.Request) error {
	id, err := triggerID(r, "hook")
	if err != nil {
		return err
	}
	wait, err := boolQuery(r, "wait")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, x.h.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("webhook body larger than %d bytes: %w", mbe.Limit, err)
		}
		return errorf("reading the webhook body failed")
	}
	run, err := x.svc.InvokeHook(r.Context(), id, r.Header.Get(api.HookTimestampHeader), r.Header.Get(api.HookSignatureHeader), body, wait)
	if err != nil {
		return err
	}
	status := http.StatusAccepted
	if wait {
		status = http.StatusOK
	}
	writeJSON(w, status, run)
	return nil
}
