package agentbox

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Pool is the state of one template's warm pool of paused sandboxes.
type Pool = api.Pool

// DiskUsage is the state of a sandbox's disk quota (Info().Disk after Get
// or Refresh).
type DiskUsage = api.DiskUsage

// SetPool keeps size paused sandboxes of template name ready (0 removes
// the pool); a Create of that template with default resources, no network
// policy and no hostname then claims one. The pool fills in the
// background.
func (c *Client) SetPool(ctx context.Context, name string, size int) (Pool, error) {
	var p Pool
	err := c.call(ctx, request{method: http.MethodPut, path: "/templates/" + url.PathEscape(name) + "/pool", json: api.PoolRequest{Size: size}}, &p)
	if err != nil {
		return Pool{}, wrapf(err, "setting pool of template %s", name)
	}
	return p, nil
}

// Pools lists the warm pools.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var pl api.PoolList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/pools"}, &pl); err != nil {
		return nil, wrapf(err, "listing pools")
	}
	return pl.Pools, nil
}
