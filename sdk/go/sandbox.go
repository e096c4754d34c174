package agentbox

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"sync"

	"github.com/agentbox/agentbox/api"
)

// SandboxSpec describes a sandbox to create: Template, Env, Labels,
// Resources, TimeoutSeconds, Hostname. The zero value is a default sandbox.
type SandboxSpec = api.CreateSandboxRequest

// Sandbox is a handle on one sandbox. Its methods are safe for concurrent
// use; Info returns the state as of the last Create, Get or Refresh.
type Sandbox struct {
	c  *Client
	id string

	// mu guards info.
	mu   sync.Mutex
	info api.Sandbox
}

func (c *Client) sandbox(info api.Sandbox) *Sandbox {
	return &Sandbox{c: c, id: info.ID, info: info}
}

// Sandbox returns a handle on the sandbox id without contacting the daemon;
// its Info is empty until Refresh. Use Get to check that it exists. id may
// also be the sandbox's name (the daemon resolves it on every call, and
// ID returns it as given; Get returns a handle on the id).
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{c: c, id: id, info: api.Sandbox{ID: id}}
}

// Create creates and starts a sandbox and returns once it is running.
func (c *Client) Create(ctx context.Context, spec SandboxSpec) (*Sandbox, error) {
	var info api.Sandbox
	if err := c.call(ctx, request{method: http.MethodPost, path: "/sandboxes", json: spec}, &info); err != nil {
		return nil, wrapf(err, "creating sandbox")
	}
	return c.sandbox(info), nil
}

// Get returns the sandbox id (or of that name: the handle's ID is the
// sandbox's id); IsNotFound(err) when there is none.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var info api.Sandbox
	if err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(id)}, &info); err != nil {
		return nil, wrapf(err, "getting sandbox %s", id)
	}
	return c.sandbox(info), nil
}

// List returns the sandboxes carrying every label in labels (all when empty).
func (c *Client) List(ctx context.Context, labels map[string]string) ([]*Sandbox, error) {
	q := url.Values{}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+labels[k])
	}
	var list api.SandboxList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/sandboxes", query: q}, &list); err != nil {
		return nil, wrapf(err, "listing sandboxes")
	}
	out := make([]*Sandbox, 0, len(list.Sandboxes))
	for _, info := range list.Sandboxes {
		out = append(out, c.sandbox(info))
	}
	return out, nil
}

func sandboxPath(id string) string { return "/sandboxes/" + url.PathEscape(id) }

// ID returns the sandbox's id.
func (s *Sandbox) ID() string { return s.id }

// Info returns the sandbox's description as last fetched.
func (s *Sandbox) Info() api.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

// Refresh fetches the sandbox's current description.
func (s *Sandbox) Refresh(ctx context.Context) error {
	var info api.Sandbox
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("")}, &info); err != nil {
		return wrapf(err, "refreshing sandbox %s", s.id)
	}
	s.mu.Lock()
	s.info = info
	s.mu.Unlock()
	return nil
}

// Delete stops the sandbox, kills everything in it and removes it.
func (s *Sandbox) Delete(ctx context.Context) error {
	if err := s.c.call(ctx, request{method: http.MethodDelete, path: s.path("")}, nil); err != nil {
		return wrapf(err, "deleting sandbox %s", s.id)
	}
	return nil
}

// Kill is Delete.
func (s *Sandbox) Kill(ctx context.Context) error { return s.Delete(ctx) }

// path returns the escaped API path of sub below this sandbox.
func (s *Sandbox) path(sub string) string { return sandboxPath(s.id) + sub }
