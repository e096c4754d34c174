package agentbox

import (
	"context"
	"io"
	"net/http"

	"github.com/agentbox/agentbox/api"
)

// Runner is a staged guest binary (see api/upgrade.go).
type Runner = api.Runner

// UpgradeOptions choose the runner an upgrade moves a sandbox's guest to:
// a binary path on the daemon's host (Runner), a staged runner (RunnerHash,
// from StageRunner), or, with neither, the daemon's own runner.
type UpgradeOptions = api.UpgradeRequest

// Upgrade swaps the sandbox's guest for the runner opts names: the runner
// is validated first, the guest and every process restart on it, and the
// new guest must answer with the expected build. Files are untouched. On
// failure the sandbox runs a guest that started before (the error says
// which; its status is 412 when the previous guest came back).
func (s *Sandbox) Upgrade(ctx context.Context, opts UpgradeOptions) (api.UpgradeResult, error) {
	var res api.UpgradeResult
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/upgrade"), json: opts}, &res); err != nil {
		return api.UpgradeResult{}, wrapf(err, "upgrading sandbox %s", s.id)
	}
	s.mu.Lock()
	s.info = res.Sandbox
	s.mu.Unlock()
	return res, nil
}

// StageRunner uploads an agentbox binary (size bytes, or -1 when unknown)
// to the daemon, which keeps it as a runner once it passes its self-check.
func (c *Client) StageRunner(ctx context.Context, binary io.Reader, size int64) (Runner, error) {
	var r Runner
	if err := c.call(ctx, request{method: http.MethodPost, path: "/runners", body: binary, ctype: "application/octet-stream", size: size}, &r); err != nil {
		return Runner{}, wrapf(err, "staging runner")
	}
	return r, nil
}

// Runners lists the runners in place and the sandboxes running each.
func (c *Client) Runners(ctx context.Context) ([]Runner, error) {
	var list api.RunnerList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/runners"}, &list); err != nil {
		return nil, wrapf(err, "listing runners")
	}
	return list.Runners, nil
}
