package agentbox

import (
	"bytes"
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// SecretInfo describes a stored secret (never its value).
type SecretInfo = api.SecretInfo

// SandboxEvent is one event of a sandbox: recorded by the flight recorder
// (a run, a file or package it changed, a network decision, a lifecycle
// operation or transition) or sent by a program inside through the API
// bridge.
type SandboxEvent = api.SandboxEvent

// SetSecret stores value under name in the daemon's encrypted secret store,
// replacing an earlier value. Values are write-only: no call returns them.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) (SecretInfo, error) {
	var info SecretInfo
	r := request{method: http.MethodPut, path: "/secrets/" + url.PathEscape(name),
		body: bytes.NewReader(value), size: int64(len(value)), ctype: "application/octet-stream"}
	if err := c.call(ctx, r, &info); err != nil {
		return SecretInfo{}, wrapf(err, "storing secret %s", name)
	}
	return info, nil
}

// Secrets lists the stored secrets' names and times, ordered by name.
func (c *Client) Secrets(ctx context.Context) ([]SecretInfo, error) {
	var list api.SecretList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/secrets"}, &list); err != nil {
		return nil, wrapf(err, "listing secrets")
	}
	return list.Secrets, nil
}

// DeleteSecret removes a stored secret; IsNotFound(err) when there is none.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	if err := c.call(ctx, request{method: http.MethodDelete, path: "/secrets/" + url.PathEscape(name)}, nil); err != nil {
		return wrapf(err, "deleting secret %s", name)
	}
	return nil
}

// Events returns the sandbox's events, oldest first: with the daemon's
// flight recorder on, every event it recorded (QueryEvents selects); off,
// the events programs inside sent through the API bridge.
func (s *Sandbox) Events(ctx context.Context) ([]SandboxEvent, error) {
	var list api.SandboxEventList
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/events")}, &list); err != nil {
		return nil, wrapf(err, "listing events of sandbox %s", s.id)
	}
	return list.Events, nil
}

// WithSecret puts stored secret name into the command's environment as
// variable env (default: name). The value exists only in that process's
// environment; it is redacted from the sandbox's output.
func WithSecret(name, env string) ExecOption {
	return func(r *api.ExecRequest) { r.Secrets = append(r.Secrets, api.ExecSecret{Name: name, Env: env}) }
}

// WithRunToken gives the command a short-lived token for the API bridge in
// AGENTBOX_RUN_TOKEN, revoked when the command ends.
func WithRunToken() ExecOption { return func(r *api.ExecRequest) { r.Token = true } }
