package e2b

import "time"

// The control plane's JSON shapes (E2B's openapi.yml, components).

// newSandbox is the body of POST /sandboxes and /v2/sandboxes. Fields of
// E2B this front end does not act on (network, mcp, volumeMounts, ...)
// are accepted and ignored; docs/E2B.md lists them.
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout,omitempty"` // seconds
	AutoPause  bool              `json:"autoPause,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	Secure     *bool             `json:"secure,omitempty"`
}

// sandboxCreated is the response of create, connect and fork.
type sandboxCreated struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	Alias           string `json:"alias,omitempty"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken opens the ports other than envd's (the code
	// interpreter's); the SDK sends it as E2B-Traffic-Access-Token.
	TrafficAccessToken string  `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is GET /sandboxes/{id} and an entry of the lists.
type sandboxDetail struct {
	TemplateID         string            `json:"templateID"`
	Alias              string            `json:"alias,omitempty"`
	SandboxID          string            `json:"sandboxID"`
	ClientID           string            `json:"clientID"`
	StartedAt          time.Time         `json:"startedAt"`
	EndAt              time.Time         `json:"endAt"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    string            `json:"envdAccessToken,omitempty"`
	TrafficAccessToken string            `json:"trafficAccessToken,omitempty"`
	Domain             *string           `json:"domain"`
	CPUCount           int               `json:"cpuCount"`
	MemoryMB           int64             `json:"memoryMB"`
	DiskSizeMB         int64             `json:"diskSizeMB"`
	Metadata           map[string]string `json:"metadata"`
	State              string            `json:"state"` // running or paused
}

// timeoutBody is the body of POST /sandboxes/{id}/timeout and of connect.
type timeoutBody struct {
	Timeout int64 `json:"timeout"` // seconds
}

// refreshBody is the body of POST /sandboxes/{id}/refreshes.
type refreshBody struct {
	Duration int64 `json:"duration"` // seconds
}

// forkBody is the body of POST /sandboxes/{id}/fork.
type forkBody struct {
	Timeout *int64 `json:"timeout,omitempty"`
	Count   int    `json:"count,omitempty"`
}

// forkResult is one entry of the fork response.
type forkResult struct {
	Sandbox *sandboxCreated `json:"sandbox,omitempty"`
	Error   *apiError       `json:"error,omitempty"`
}

// snapshotBody is the body of POST /sandboxes/{id}/snapshots.
type snapshotBody struct {
	Name string `json:"name,omitempty"`
}

// snapshotInfo describes a snapshot (an agentbox checkpoint).
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// sandboxMetric is one entry of GET /sandboxes/{id}/metrics.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}
