package api

import "time"

// Schedules and webhooks are triggers of the execution pipeline (see
// api/runs.go): each firing runs Action like an exec would and leaves the
// same Run record.

// Missed-run policies of a schedule: what happens to slots that passed
// while the daemon was down.
const (
	MissedRunSkip    = "skip"     // run at the next slot only (default)
	MissedRunRunOnce = "run_once" // run once at start-up for all missed slots, then as usual
)

// RunAction is what a schedule or webhook runs: a command in a fresh
// sandbox of Template, deleted after the run, or, when Name is set, in the
// sandbox of that name (created with Lifecycle on first use, reused after).
// Its fields are inline in the JSON of schedules and hooks.
type RunAction struct {
	Template       string            `json:"template,omitempty"`
	Name           string            `json:"name,omitempty"`
	Lifecycle      string            `json:"lifecycle,omitempty"`
	Cmd            []string          `json:"cmd,omitempty"`
	Command        string            `json:"command,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
}

// CreateScheduleRequest is the body of POST /v1/schedules.
type CreateScheduleRequest struct {
	// Cron is a standard 5-field cron expression ("0 9 * * 1") or a
	// descriptor ("@daily", "@every 1h").
	Cron string `json:"cron"`
	// Timezone is an IANA zone ("Europe/Paris"); default UTC.
	Timezone        string `json:"timezone,omitempty"`
	MissedRunPolicy string `json:"missed_run_policy,omitempty"` // MissedRunSkip (default) or MissedRunRunOnce
	RunAction
}

// Schedule is a cron trigger.
type Schedule struct {
	ID              string `json:"id"`
	Cron            string `json:"cron"`
	Timezone        string `json:"timezone"`
	MissedRunPolicy string `json:"missed_run_policy"`
	RunAction
	Tenant    string     `json:"tenant"`
	CreatedAt time.Time  `json:"created_at"`
	NextRunAt *time.Time `json:"next_run_at,omitempty"`
	// LastSlotAt is the last cron slot that was run or deliberately
	// skipped; LastRunID the run of the newest firing.
	LastSlotAt *time.Time `json:"last_slot_at,omitempty"`
	LastRunID  string     `json:"last_run_id,omitempty"`
}

// ScheduleList is the body of GET /v1/schedules.
type ScheduleList struct {
	Schedules []Schedule `json:"schedules"`
}

// Webhook request headers: the signature is "sha256=" and the hex
// HMAC-SHA256, keyed with the hook's secret, of "<timestamp>.<body>"; the
// timestamp is in Unix seconds and must be within 5 minutes of the
// daemon's clock. A signature is accepted once.
const (
	HookSignatureHeader = "X-Agentbox-Signature"
	HookTimestampHeader = "X-Agentbox-Timestamp"
)

// Environment of a webhook run: the request body is the command's stdin.
const (
	HookIDEnv = "AGENTBOX_HOOK_ID"
	RunIDEnv  = "AGENTBOX_RUN_ID"
)

// CreateHookRequest is the body of POST /v1/hooks.
type CreateHookRequest struct {
	RunAction
}

// Hook is a webhook trigger. Its secret is shown only once, in the
// response to its creation.
type Hook struct {
	ID string `json:"id"`
	RunAction
	Tenant    string    `json:"tenant"`
	CreatedAt time.Time `json:"created_at"`
	// Secret is set only in the response of POST /v1/hooks.
	Secret    string `json:"secret,omitempty"`
	LastRunID string `json:"last_run_id,omitempty"`
}

// HookList is the body of GET /v1/hooks.
type HookList struct {
	Hooks []Hook `json:"hooks"`
}
