// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/agentbox/agentbox/internal/version.Version=...".
package version

// Version is the agentbox release; "dev" for untagged builds.
var Version = "0.1.0-dev"
