package agentbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Run records, usage, schedules and webhooks: every command the daemon
// runs, whatever triggered it, leaves a Run of the same shape.
type (
	Run                   = api.Run
	Usage                 = api.Usage
	UsageRecord           = api.UsageRecord
	RunAction             = api.RunAction
	Schedule              = api.Schedule
	CreateScheduleRequest = api.CreateScheduleRequest
	Hook                  = api.Hook
)

// RunQuery selects run records; zero fields match everything.
type RunQuery struct {
	Sandbox string
	Trigger string // api.TriggerAPI, api.TriggerSchedule, api.TriggerWebhook, api.TriggerMCP, api.TriggerE2B, api.TriggerReplay
	Limit   int    // 0: the daemon's default (100)
}

// Runs returns run records, newest first.
func (c *Client) Runs(ctx context.Context, q RunQuery) ([]Run, error) {
	v := url.Values{}
	if q.Sandbox != "" {
		v.Set("sandbox", q.Sandbox)
	}
	if q.Trigger != "" {
		v.Set("trigger", q.Trigger)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var list api.RunList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/runs", query: v}, &list); err != nil {
		return nil, wrapf(err, "listing runs")
	}
	return list.Runs, nil
}

// Run returns one run record.
func (c *Client) Run(ctx context.Context, id string) (Run, error) {
	var r Run
	if err := c.call(ctx, request{method: http.MethodGet, path: "/runs/" + url.PathEscape(id)}, &r); err != nil {
		return Run{}, wrapf(err, "getting run %s", id)
	}
	return r, nil
}

func usageQuery(sandbox string, since time.Time) url.Values {
	v := url.Values{}
	if sandbox != "" {
		v.Set("sandbox", sandbox)
	}
	if !since.IsZero() {
		v.Set("since", since.UTC().Format(time.RFC3339))
	}
	return v
}

// Usage returns metered usage per tenant and sandbox, split by trigger,
// of the runs of sandbox ("" for all) started at or after since (zero:
// all).
func (c *Client) Usage(ctx context.Context, sandbox string, since time.Time) (Usage, error) {
	var u Usage
	if err := c.call(ctx, request{method: http.MethodGet, path: "/usage", query: usageQuery(sandbox, since)}, &u); err != nil {
		return Usage{}, wrapf(err, "getting usage")
	}
	return u, nil
}

// ExportUsage calls fn with one metering record per finished run, oldest
// first, as the daemon streams them.
func (c *Client) ExportUsage(ctx context.Context, sandbox string, since time.Time, fn func(UsageRecord) error) error {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/usage/export", query: usageQuery(sandbox, since)})
	if err != nil {
		return wrapf(err, "exporting usage")
	}
	defer resp.Body.Close()
	dec := newNDJSON(resp.Body)
	for {
		var rec UsageRecord
		if err := dec.next(&rec); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return wrapf(err, "exporting usage")
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// CreateSchedule creates a cron schedule.
func (c *Client) CreateSchedule(ctx context.Context, req CreateScheduleRequest) (Schedule, error) {
	var s Schedule
	if err := c.call(ctx, request{method: http.MethodPost, path: "/schedules", json: req}, &s); err != nil {
		return Schedule{}, wrapf(err, "creating schedule")
	}
	return s, nil
}

// Schedules lists the schedules.
func (c *Client) Schedules(ctx context.Context) ([]Schedule, error) {
	var list api.ScheduleList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/schedules"}, &list); err != nil {
		return nil, wrapf(err, "listing schedules")
	}
	return list.Schedules, nil
}

// Schedule returns one schedule.
func (c *Client) Schedule(ctx context.Context, id string) (Schedule, error) {
	var s Schedule
	if err := c.call(ctx, request{method: http.MethodGet, path: "/schedules/" + url.PathEscape(id)}, &s); err != nil {
		return Schedule{}, wrapf(err, "getting schedule %s", id)
	}
	return s, nil
}

// DeleteSchedule deletes a schedule.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/schedules/" + url.PathEscape(id)}, nil); err != nil {
		return wrapf(err, "deleting schedule %s", id)
	}
	return nil
}

// TriggerSchedule runs a schedule now (the same path as a cron slot) and
// returns the finished run.
func (c *Client) TriggerSchedule(ctx context.Context, id string) (Run, error) {
	var r Run
	if err := c.call(ctx, request{method: http.MethodPost, path: "/schedules/" + url.PathEscape(id) + "/trigger"}, &r); err != nil {
		return Run{}, wrapf(err, "triggering schedule %s", id)
	}
	return r, nil
}

// CreateHook creates a webhook; the returned Hook's Secret is shown only
// now.
func (c *Client) CreateHook(ctx context.Context, a RunAction) (Hook, error) {
	var h Hook
	if err := c.call(ctx, request{method: http.MethodPost, path: "/hooks", json: api.CreateHookRequest{RunAction: a}}, &h); err != nil {
		return Hook{}, wrapf(err, "creating hook")
	}
	return h, nil
}

// Hooks lists the webhooks (without secrets).
func (c *Client) Hooks(ctx context.Context) ([]Hook, error) {
	var list api.HookList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/hooks"}, &list); err != nil {
		return nil, wrapf(err, "listing hooks")
	}
	return list.Hooks, nil
}

// DeleteHook deletes a webhook.
func (c *Client) DeleteHook(ctx context.Context, id string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/hooks/" + url.PathEscape(id)}, nil); err != nil {
		return wrapf(err, "deleting hook %s", id)
	}
	return nil
}

// SignHook returns the X-Agentbox-Signature value of body sent at ts
// (Unix seconds) to a hook with secret.
func SignHook(secret string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "%d.", ts)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// DeliverHook sends a signed webhook delivery of body to hook id, as a
// third party would (no API key is needed for this call). With wait it
// returns the finished run, else the running one.
func (c *Client) DeliverHook(ctx context.Context, id, secret string, body []byte, wait bool) (Run, error) {
	ts := time.Now().Unix()
	return c.DeliverHookSigned(ctx, id, strconv.FormatInt(ts, 10), SignHook(secret, ts, body), body, wait)
}

// DeliverHookSigned sends body with the given timestamp and signature
// headers verbatim (to test a receiver's checks).
func (c *Client) DeliverHookSigned(ctx context.Context, id, timestamp, signature string, body []byte, wait bool) (Run, error) {
	v := url.Values{}
	if wait {
		v.Set("wait", "true")
	}
	r := request{method: http.MethodPost, path: "/hooks/" + url.PathEscape(id), query: v,
		body: bytes.NewReader(body), size: int64(len(body)), ctype: "application/octet-stream",
		header: http.Header{api.HookTimestampHeader: {timestamp}, api.HookSignatureHeader: {signature}}}
	var run Run
	if err := c.call(ctx, r, &run); err != nil {
		return Run{}, wrapf(err, "delivering to hook %s", id)
	}
	return run, nil
}
