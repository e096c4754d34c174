package agentbox

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/api"
)

// Templates lists the templates the daemon knows, built or not.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var list api.TemplateList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/templates"}, &list); err != nil {
		return nil, wrapf(err, "listing templates")
	}
	return list.Templates, nil
}

// Template describes the template name.
func (c *Client) Template(ctx context.Context, name string) (api.Template, error) {
	var t api.Template
	if err := c.call(ctx, request{method: http.MethodGet, path: "/templates/" + url.PathEscape(name)}, &t); err != nil {
		return api.Template{}, wrapf(err, "getting template %s", name)
	}
	return t, nil
}

// BuildTemplate builds a template and returns it once built. progress, when
// non-nil, is called with every event of the build stream (steps and log
// lines, then the final done or error event) as it arrives.
func (c *Client) BuildTemplate(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (api.Template, error) {
	name := req.Name
	if req.Spec != nil && req.Spec.Name != "" {
		name = req.Spec.Name
	}
	resp, err := c.send(ctx, request{method: http.MethodPost, path: "/templates/build", json: req})
	if err != nil {
		return api.Template{}, wrapf(err, "building template %s", name)
	}
	defer resp.Body.Close()
	dec := newNDJSON(resp.Body)
	for {
		var ev api.BuildEvent
		if err := dec.next(&ev); err != nil {
			return api.Template{}, fmt.Errorf("building template %s: %w", name, truncated("reading progress", err))
		}
		if progress != nil {
			progress(ev)
		}
		switch ev.Type {
		case api.BuildEventDone:
			if ev.Template == nil {
				return api.Template{}, fmt.Errorf("building template %s: done event without a template", name)
			}
			return *ev.Template, nil
		case api.BuildEventError:
			return api.Template{}, fmt.Errorf("building template %s: %w", name, streamError(ev.Error))
		}
	}
}
