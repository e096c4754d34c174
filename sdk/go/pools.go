package agentbox

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Pool is the state of one warm pool of paused sandboxes: a template's on
// one backend (Pool.Runtime).
type Pool = api.Pool

// DiskUsage is the state of a sandbox's disk quota (Info().Disk after Get
// or Refresh).
type DiskUsage = api.DiskUsage

// SetPool keeps size paused sandboxes of template name ready (0 removes
// the pool); a Create of that template with default resources, no network
// policy and no hostname, that runs on the pool's backend, then claims
// one. The pool's backend is the one a Create of the template naming none
// runs on, unless PoolRuntime names another; a template may have a pool
// per backend. The pool fills in the background.
func (c *Client) SetPool(ctx context.Context, name string, size int, opts ...PoolOption) (Pool, error) {
	req := api.PoolRequest{Size: size}
	for _, o := range opts {
		o(&req)
	}
	var p Pool
	err := c.call(ctx, request{method: http.MethodPut, path: "/templates/" + url.PathEscape(name) + "/pool", json: req}, &p)
	if err != nil {
		return Pool{}, wrapf(err, "setting pool of template %s", name)
	}
	return p, nil
}

// PoolOption is an option of SetPool.
type PoolOption func(*api.PoolRequest)

// PoolRuntime makes SetPool set the pool of backend rt ("gvisor",
// "native": one of those Info lists) rather than the template's default
// one.
func PoolRuntime(rt string) PoolOption { return func(r *api.PoolRequest) { r.Runtime = rt } }

// Pools lists the warm pools.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var pl api.PoolList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/pools"}, &pl); err != nil {
		return nil, wrapf(err, "listing pools")
	}
	return pl.Pools, nil
}
