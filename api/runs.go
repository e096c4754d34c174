package api

import "time"

// One execution pipeline: every command run in a sandbox, whatever
// triggered it (an exec through the API, CLI or SDK, a schedule, a
// webhook), goes through the daemon's single Execute path and leaves the
// same Run record, with the same metering.

// Run triggers.
const (
	TriggerAPI      = "api"      // exec through the API (CLI and SDK included)
	TriggerSchedule = "schedule" // a schedule fired (or was triggered by hand)
	TriggerWebhook  = "webhook"  // a signed POST /v1/hooks/{id}
	TriggerMCP      = "mcp"      // a tool call over MCP (agentbox mcp, POST /mcp)
	TriggerE2B      = "e2b"      // a command through the E2B-compatible API (agentbox serve --e2b)
	TriggerReplay   = "replay"   // a recorded run re-run by POST /v1/sandboxes/{id}/replay
)

// Run states.
const (
	RunRunning  = "running"
	RunFinished = "finished" // the command exited (any exit code, signal or timeout)
	RunFailed   = "failed"   // the command could not be started or its end was not seen
	// RunLost: the daemon stopped during the run and the next one found
	// its process gone without an exit status (its sandbox was deleted or
	// restarted meanwhile).
	RunLost = "lost"
)

// Run is the record of one command run through the pipeline.
type Run struct {
	ID      string `json:"id"`
	Trigger string `json:"trigger"` // TriggerAPI, TriggerSchedule, TriggerWebhook, TriggerMCP, TriggerE2B or TriggerReplay
	// Who caused it: "unix-socket", "api-key:<key id>", "schedule:<id>",
	// "hook:<id>".
	Who      string   `json:"who"`
	Tenant   string   `json:"tenant"`
	Template string   `json:"template,omitempty"`
	Sandbox  string   `json:"sandbox,omitempty"`
	Cmd      []string `json:"cmd,omitempty"`
	Command  string   `json:"command,omitempty"`
	State    string   `json:"state"` // RunRunning, RunFinished, RunFailed, RunLost
	ExitCode *int     `json:"exit_code,omitempty"`
	Signal   string   `json:"signal,omitempty"`
	TimedOut bool     `json:"timed_out,omitempty"`
	// Error says why a failed run failed.
	Error           string     `json:"error,omitempty"`
	StartedAt       time.Time  `json:"started_at"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	DurationSeconds float64    `json:"duration_seconds"`
	Usage           RunUsage   `json:"usage"`
	// Output is the tail of the combined stdout and stderr of runs nobody
	// watched (schedules, webhooks), secrets redacted; empty for API runs.
	Output []byte `json:"output,omitempty"`
}

// RunUsage is what one run consumed. CPU and memory are the sandbox's
// cgroup counters over the run (a sandbox running two commands at once
// charges both with the whole sandbox); memory is the time integral of
// the sandbox's memory use sampled during the run (1 GB = 2^30 bytes).
type RunUsage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryGBSeconds float64 `json:"memory_gb_seconds"`
	// EgressBytes is what the run's connections through the egress proxy
	// sent and received.
	EgressBytes int64 `json:"egress_bytes"`
}

// RunList is the body of GET /v1/runs, newest first.
type RunList struct {
	Runs []Run `json:"runs"`
}

// UsageTotals are summed run usage.
type UsageTotals struct {
	Runs            int64   `json:"runs"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryGBSeconds float64 `json:"memory_gb_seconds"`
	EgressBytes     int64   `json:"egress_bytes"`
	// ByTrigger splits the same totals by the trigger of each run (the
	// ByTrigger of the nested totals is empty).
	ByTrigger map[string]UsageTotals `json:"by_trigger,omitempty"`
}

// SandboxUsage is the usage of one sandbox's runs.
type SandboxUsage struct {
	Sandbox  string      `json:"sandbox"`
	Template string      `json:"template,omitempty"`
	Tenant   string      `json:"tenant"`
	Totals   UsageTotals `json:"totals"`
}

// TenantUsage is the usage of one tenant's runs.
type TenantUsage struct {
	Tenant string      `json:"tenant"`
	Totals UsageTotals `json:"totals"`
}

// Usage is the body of GET /v1/usage: the runs started at or after Since.
type Usage struct {
	Since     *time.Time     `json:"since,omitempty"`
	Until     time.Time      `json:"until"`
	Tenants   []TenantUsage  `json:"tenants"`
	Sandboxes []SandboxUsage `json:"sandboxes"`
}

// UsageRecord is one line of GET /v1/usage/export (application/x-ndjson):
// the metering of one finished run.
type UsageRecord struct {
	Run             string    `json:"run"`
	Tenant          string    `json:"tenant"`
	Sandbox         string    `json:"sandbox,omitempty"`
	Template        string    `json:"template,omitempty"`
	Trigger         string    `json:"trigger"`
	Who             string    `json:"who"`
	StartedAt       time.Time `json:"started_at"`
	DurationSeconds float64   `json:"duration_seconds"`
	CPUSeconds      float64   `json:"cpu_seconds"`
	MemoryGBSeconds float64   `json:"memory_gb_seconds"`
	EgressBytes     int64     `json:"egress_bytes"`
	ExitCode        *int      `json:"exit_code,omitempty"`
}
