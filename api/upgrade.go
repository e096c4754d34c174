package api

// Runner hot-swap: the guest (the in-sandbox agent, PID 1) is an agentbox
// binary kept outside the user's layers in a content-addressed, read-only
// runner directory. Upgrading a sandbox's guest stages and validates a new
// runner (its own self-check must pass before anything is swapped), stops
// the sandbox's guest and processes, restarts it on the new runner over the
// same layers and writable layer, and checks the new guest answers with the
// expected build; on any failure the previous runner is started again.
// User files and installed packages are not touched. New sandboxes always
// start on the daemon's own runner.

// UpgradeRequest is the body of POST /v1/sandboxes/{id}/upgrade. At most
// one of Runner and RunnerHash is set; with neither, the sandbox moves to
// the daemon's own runner (the binary the daemon runs now).
type UpgradeRequest struct {
	// Runner is the path of an agentbox binary on the daemon's host.
	Runner string `json:"runner,omitempty"`
	// RunnerHash names a runner already staged (POST /v1/runners).
	RunnerHash string `json:"runner_hash,omitempty"`
}

// UpgradeResult is the response of POST /v1/sandboxes/{id}/upgrade.
type UpgradeResult struct {
	Sandbox     Sandbox `json:"sandbox"`
	FromRunner  string  `json:"from_runner"`
	ToRunner    string  `json:"to_runner"`
	FromVersion string  `json:"from_version"`
	ToVersion   string  `json:"to_version"`
	// Changed is false when the sandbox already ran that runner.
	Changed    bool  `json:"changed"`
	DurationMS int64 `json:"duration_ms"`
}

// Runner is a staged, validated guest binary (POST /v1/runners, whose body
// is the binary itself, application/octet-stream).
type Runner struct {
	// Hash names the runner: a prefix of the binary's sha256.
	Hash string `json:"hash"`
	// Version and Build are what the binary's self-check reported;
	// GuestVersion is what its guest reports ("<version>+<build>").
	Version      string `json:"version,omitempty"`
	Build        string `json:"build"`
	GuestVersion string `json:"guest_version"`
	// Default is set on the daemon's own runner, the one new sandboxes use.
	Default bool `json:"default,omitempty"`
	// Sandboxes are the ids of the sandboxes whose guest runs it.
	Sandboxes []string `json:"sandboxes,omitempty"`
}

// RunnerList is the body of GET /v1/runners.
type RunnerList struct {
	Runners []Runner `json:"runners"`
}
