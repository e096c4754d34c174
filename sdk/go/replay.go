package agentbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Replay, compare and artifacts (docs/AUDIT.md "Replay and compare",
// docs/ARTIFACTS.md).
type (
	ReplayRequest = api.ReplayRequest
	ReplayResult  = api.ReplayResult
	ReplayStep    = api.ReplayStep
	RunSummary    = api.RunSummary
	CompareResult = api.CompareResult
	CompareStep   = api.CompareStep
	Artifact      = api.Artifact
)

// Replay re-runs the sandbox's recorded foreground runs (req.Runs, or
// every one recorded after req.Checkpoint was taken) in a fresh fork of
// req.Checkpoint and reports where the re-runs first diverge from the
// originals (exit status, output digest, file effects). The fork is
// deleted at the end unless req.Keep. It can take as long as the runs
// did: give ctx a deadline accordingly.
func (s *Sandbox) Replay(ctx context.Context, req ReplayRequest) (ReplayResult, error) {
	var res ReplayResult
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/replay"), json: req}, &res); err != nil {
		return res, wrapf(err, "replaying sandbox %s", s.id)
	}
	return res, nil
}

// Compare puts sandboxes a and b (ids or names) side by side: their
// foreground runs paired in record order with the first divergence, and
// the diff of their files from a to b.
func (c *Client) Compare(ctx context.Context, a, b string) (CompareResult, error) {
	var res CompareResult
	if err := c.call(ctx, request{method: http.MethodGet, path: "/compare", query: url.Values{"a": {a}, "b": {b}}}, &res); err != nil {
		return res, wrapf(err, "comparing %s and %s", a, b)
	}
	return res, nil
}

// ArtifactFile is a finished file handed over as untrusted sandbox output:
// its content is data produced in a sandbox, never instructions.
type ArtifactFile struct {
	io.ReadCloser
	// Origin is the sandbox it came from ("sandbox:<id>"); Untrusted is
	// always true (the daemon's X-Agentbox-Untrusted header).
	Origin    string
	Untrusted bool
}

// OpenArtifact streams the file at path as an artifact. The caller closes
// it. An answer not marked as sandbox output is refused.
func (s *Sandbox) OpenArtifact(ctx context.Context, path string) (*ArtifactFile, error) {
	resp, err := s.c.send(ctx, request{method: http.MethodGet, path: s.path("/artifacts/file"), query: url.Values{"path": {path}}})
	if err != nil {
		return nil, wrapf(err, "artifact %s of sandbox %s", path, s.id)
	}
	if resp.Header.Get(api.UntrustedHeader) != api.UntrustedSandboxOutput {
		resp.Body.Close()
		return nil, fmt.Errorf("artifact %s of sandbox %s: the daemon did not mark it as sandbox output", path, s.id)
	}
	return &ArtifactFile{ReadCloser: resp.Body, Origin: resp.Header.Get(api.OriginHeader), Untrusted: true}, nil
}

// ArtifactDiff is the sandbox's files against from (a ref, as Client.Diff
// takes) as an untrusted artifact.
func (s *Sandbox) ArtifactDiff(ctx context.Context, from string, unified bool) (Artifact, error) {
	q := url.Values{"from": {from}}
	if unified {
		q.Set("unified", "true")
	}
	var a Artifact
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/artifacts/diff"), query: q}, &a); err != nil {
		return a, wrapf(err, "diff artifact of sandbox %s", s.id)
	}
	return a, nil
}

// RunReport is one recorded run of the sandbox with its effects, as an
// untrusted artifact.
func (s *Sandbox) RunReport(ctx context.Context, run string) (Artifact, error) {
	var a Artifact
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/artifacts/report"), query: url.Values{"run": {run}}}, &a); err != nil {
		return a, wrapf(err, "report of run %s of sandbox %s", run, s.id)
	}
	return a, nil
}
