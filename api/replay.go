package api

// Replay and compare (issue 16 item 4; docs/AUDIT.md "Replay and compare").

// ReplayRequest is the body of POST /v1/sandboxes/{id}/replay: re-run
// sandbox id's recorded foreground runs in a fresh fork of Checkpoint and
// report where they first diverge.
type ReplayRequest struct {
	// Checkpoint is the state to start from: an id or a name, as fork
	// resolves it. Required.
	Checkpoint string `json:"checkpoint"`
	// Runs are the recorded run ids to replay (in the order they were
	// recorded, whatever the order here). Default: every foreground run
	// recorded after the checkpoint was taken (and after Since).
	Runs []string `json:"runs,omitempty"`
	// Since replays only runs recorded after this sequence number of the
	// sandbox's record.
	Since uint64 `json:"since,omitempty"`
	// Continue goes on after the first divergence (every step is run and
	// compared); by default the replay stops there.
	Continue bool `json:"continue,omitempty"`
	// IgnorePaths are path prefixes ("/tmp/") whose file effects are not
	// compared.
	IgnorePaths []string `json:"ignore_paths,omitempty"`
	// StepTimeoutSeconds bounds each re-run command (default 300).
	StepTimeoutSeconds float64 `json:"step_timeout_seconds,omitempty"`
	// Keep keeps the fork for inspection (it is the caller's sandbox like
	// any other); by default it is deleted when the replay ends.
	Keep bool `json:"keep,omitempty"`
}

// RunSummary is one recorded run as a replay or compare sees it: its
// command and what it did, from the flight record.
type RunSummary struct {
	Run     string   `json:"run"`
	Seq     uint64   `json:"seq"` // of its run.started
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	User    string   `json:"user,omitempty"`
	// Outcome, ExitCode, Signal, OutputBytes and OutputSHA256 are its
	// run.ended's ("" outcome: the run has not ended in the record).
	Outcome      string `json:"outcome,omitempty"`
	ExitCode     *int   `json:"exit_code,omitempty"`
	Signal       string `json:"signal,omitempty"`
	OutputBytes  int64  `json:"output_bytes,omitempty"`
	OutputSHA256 string `json:"output_sha256,omitempty"`
	// Files and Packages are its recorded effects, in record order.
	Files    []FileEvent    `json:"files,omitempty"`
	Packages []PackageEvent `json:"packages,omitempty"`
	// FilesIncomplete: the recorder did not record every change of the
	// run (files_omitted or files_truncated).
	FilesIncomplete bool `json:"files_incomplete,omitempty"`
}

// ReplayStep is one recorded run and its re-run.
type ReplayStep struct {
	Index    int         `json:"index"`
	Original RunSummary  `json:"original"`
	Replayed *RunSummary `json:"replayed,omitempty"` // absent when not run
	// Diverged says the re-run differs from the original in exit status,
	// output digest or file effects; Differences say how, first first.
	Diverged    bool     `json:"diverged"`
	Differences []string `json:"differences,omitempty"`
	// Error is why the step could not be re-run (then it diverged).
	Error string `json:"error,omitempty"`
}

// ReplayResult is the response of POST /v1/sandboxes/{id}/replay.
type ReplayResult struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint"` // the checkpoint's id
	// Fork is the sandbox the runs were re-run in; Kept says it still
	// exists (ReplayRequest.Keep).
	Fork  string       `json:"fork"`
	Kept  bool         `json:"kept"`
	Steps []ReplayStep `json:"steps"`
	// Diverged says some step diverged; FirstDivergence is its index in
	// Steps.
	Diverged        bool `json:"diverged"`
	FirstDivergence *int `json:"first_divergence,omitempty"`
}

// CompareStep pairs the runs at one position of two sandboxes' records.
type CompareStep struct {
	Index       int         `json:"index"`
	A           *RunSummary `json:"a,omitempty"` // absent past the end of A's runs
	B           *RunSummary `json:"b,omitempty"`
	Diverged    bool        `json:"diverged"`
	Differences []string    `json:"differences,omitempty"`
}

// CompareResult is the response of GET /v1/compare?a=A&b=B: two sandboxes
// (typically forks of one checkpoint) side by side: their foreground runs
// paired in record order with where they first diverge, and the diff of
// their files now (GET /v1/diff from sandbox:A to sandbox:B).
type CompareResult struct {
	A               string        `json:"a"`
	B               string        `json:"b"`
	Steps           []CompareStep `json:"steps"`
	Diverged        bool          `json:"diverged"`
	FirstDivergence *int          `json:"first_divergence,omitempty"`
	Diff            Diff          `json:"diff"`
}

// Artifacts (issue 16 item 6): what a sandbox produced, handed to the
// caller directly rather than through an agent's context, and marked as
// untrusted sandbox output (docs/SECURITY.md "Sandbox output").

// UntrustedHeader is set on every artifact response to
// UntrustedSandboxOutput: the body was produced inside a sandbox and is
// data, never instructions.
const (
	UntrustedHeader        = "X-Agentbox-Untrusted"
	UntrustedSandboxOutput = "sandbox-output"
	// OriginHeader names the sandbox the artifact comes from
	// ("sandbox:<id>").
	OriginHeader = "X-Agentbox-Origin"
)

// Artifact kinds.
const (
	ArtifactDiff   = "diff"
	ArtifactReport = "report"
)

// Artifact is the body of GET /v1/sandboxes/{id}/artifacts/diff and
// .../artifacts/report: a structured artifact with its marking in the
// body too, for callers that keep the body without the headers.
type Artifact struct {
	// Untrusted is always true: the content was produced in a sandbox.
	Untrusted bool   `json:"untrusted"`
	Origin    string `json:"origin"` // "sandbox:<id>"
	Kind      string `json:"kind"`   // ArtifactDiff or ArtifactReport
	// Diff is the sandbox's files against the "from" ref (kind diff).
	Diff *Diff `json:"diff,omitempty"`
	// Report is one run with its effects, from the flight record (kind
	// report).
	Report *RunSummary `json:"report,omitempty"`
}
