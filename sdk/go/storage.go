package agentbox

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/agentbox/agentbox/api"
)

// ExportTemplate streams template name as an OCI image archive (tar): an
// OCI image layout with gzip'd layers, loadable by OCI tools and `docker
// load`. The caller closes the reader.
func (c *Client) ExportTemplate(ctx context.Context, name string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/templates/" + url.PathEscape(name) + "/export"})
	if err != nil {
		return nil, wrapf(err, "exporting template %s", name)
	}
	return resp.Body, nil
}

// ExportCheckpoint streams checkpoint cid (its whole filesystem) as an OCI
// image archive. The caller closes the reader.
func (c *Client) ExportCheckpoint(ctx context.Context, cid string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: checkpointPath(cid) + "/export"})
	if err != nil {
		return nil, wrapf(err, "exporting checkpoint %s", cid)
	}
	return resp.Body, nil
}

// ImportTemplate creates or replaces template name from an image archive
// streamed from archive: an OCI image archive or a `docker save` archive
// (tar, optionally gzip'd).
func (c *Client) ImportTemplate(ctx context.Context, name string, archive io.Reader) (api.Template, error) {
	var t api.Template
	err := c.call(ctx, request{method: http.MethodPost, path: "/templates/import", query: url.Values{"name": {name}},
		body: archive, ctype: "application/x-tar", size: -1}, &t)
	if err != nil {
		return api.Template{}, wrapf(err, "importing template %s", name)
	}
	return t, nil
}

// ImportTemplateDir creates or replaces template name from an OCI image
// layout directory at the absolute path dir on the daemon's host.
func (c *Client) ImportTemplateDir(ctx context.Context, name, dir string) (api.Template, error) {
	var t api.Template
	err := c.call(ctx, request{method: http.MethodPost, path: "/templates/import", query: url.Values{"name": {name}},
		json: api.ImportTemplateRequest{Path: dir}}, &t)
	if err != nil {
		return api.Template{}, wrapf(err, "importing template %s from %s", name, dir)
	}
	return t, nil
}

// CollectGarbage removes layers no template, checkpoint or sandbox uses and
// that were not created or used in the last minAge (negative: the daemon's
// default, 10 minutes).
func (c *Client) CollectGarbage(ctx context.Context, minAge time.Duration) (api.GCResult, error) {
	var req api.GCRequest
	if minAge >= 0 {
		s := int64(minAge / time.Second)
		req.MinAgeSeconds = &s
	}
	var res api.GCResult
	if err := c.call(ctx, request{method: http.MethodPost, path: "/gc", json: req}, &res); err != nil {
		return api.GCResult{}, wrapf(err, "collecting garbage")
	}
	return res, nil
}
