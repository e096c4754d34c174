package agentbox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/api"
)

// Diff, merge and saved templates.

// Diff is the result of Client.Diff: the changes that turn one filesystem
// state into another.
type Diff = api.Diff

// MergeResult is the result of Sandbox.Merge.
type MergeResult = api.MergeResult

// TemplateVersion is one immutable saved version of a template.
type TemplateVersion = api.TemplateVersion

// Diff compares two filesystem states. A ref is "sandbox:<id>" (its live
// state), "checkpoint:<id|name>", "template:<name>[@<version>]", or a bare
// sandbox id, checkpoint id or template name. With unified, small text
// files carry a unified diff.
func (c *Client) Diff(ctx context.Context, from, to string, unified bool) (Diff, error) {
	return c.DiffWith(ctx, from, to, DiffOptions{Unified: unified})
}

// DiffOptions are the options of Client.DiffWith.
type DiffOptions = api.DiffOptions

// DiffWith is Diff with options: opts.IncludeIdentity keeps the identity
// files every fork gets fresh (/etc/machine-id,
// /var/lib/systemd/random-seed), which are left out by default.
func (c *Client) DiffWith(ctx context.Context, from, to string, opts DiffOptions) (Diff, error) {
	q := url.Values{"from": {from}, "to": {to}}
	if opts.Unified {
		q.Set("unified", "true")
	}
	if opts.IncludeIdentity {
		q.Set("include_identity", "true")
	}
	var d Diff
	if err := c.call(ctx, request{method: http.MethodGet, path: "/diff", query: q}, &d); err != nil {
		return Diff{}, wrapf(err, "diff %s %s", from, to)
	}
	return d, nil
}

// TreeHash returns the content hash of the sandbox's filesystem as seen
// from inside; a sandbox fresh from a template version has the version's
// TreeHash.
func (s *Sandbox) TreeHash(ctx context.Context) (string, error) {
	var th api.TreeHash
	if err := s.c.call(ctx, request{method: http.MethodGet, path: s.path("/treehash")}, &th); err != nil {
		return "", wrapf(err, "hashing sandbox %s", s.id)
	}
	return th.TreeHash, nil
}

// MergeOptions choose how a merge treats conflicts.
type MergeOptions struct {
	// Strategy for conflicts: api.MergeFail (default), api.MergeOurs (keep
	// this sandbox's version) or api.MergeTheirs (take the source's).
	Strategy string
	// Resolutions choose a side per path ("ours" or "theirs"), over Strategy.
	Resolutions map[string]string
	// DryRun reports what would be applied and the conflicts, changing
	// nothing.
	DryRun bool
	// IncludeIdentity merges the identity files every fork gets fresh
	// (/etc/machine-id, /var/lib/systemd/random-seed) like any other path;
	// by default each sandbox keeps its own.
	IncludeIdentity bool
}

// MergeConflictError is returned by Merge when paths changed on both sides
// and no side was chosen for them; nothing was applied. It wraps the
// *APIError (IsConflict(err) is true).
type MergeConflictError struct {
	*APIError
	Conflicts []api.MergeConflict
}

func (e *MergeConflictError) Unwrap() error { return e.APIError }

// Merge applies the changes sandbox from made since the two sandboxes'
// common fork point (one forked from the other, or both from one
// checkpoint) to this sandbox. Unresolved conflicts: a
// *MergeConflictError, and nothing changed.
func (s *Sandbox) Merge(ctx context.Context, from string, opts MergeOptions) (MergeResult, error) {
	req := api.MergeRequest{From: from, Strategy: opts.Strategy, Resolutions: opts.Resolutions, DryRun: opts.DryRun, IncludeIdentity: opts.IncludeIdentity}
	var res MergeResult
	err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/merge"), json: req}, &res)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusConflict {
		var body api.MergeConflictError
		if json.Unmarshal(ae.body, &body) == nil && len(body.Conflicts) > 0 {
			err = &MergeConflictError{APIError: ae, Conflicts: body.Conflicts}
		}
	}
	if err != nil {
		return MergeResult{}, wrapf(err, "merging %s into %s", from, s.id)
	}
	return res, nil
}

// SaveTemplate freezes the sandbox's filesystem as a new immutable version
// of template name; create sandboxes from "name" (newest version) or
// "name@N".
func (s *Sandbox) SaveTemplate(ctx context.Context, name string) (TemplateVersion, error) {
	var v TemplateVersion
	if err := s.c.call(ctx, request{method: http.MethodPost, path: s.path("/template"), json: api.SaveTemplateRequest{Name: name}}, &v); err != nil {
		return TemplateVersion{}, wrapf(err, "saving sandbox %s as template %s", s.id, name)
	}
	return v, nil
}

// TemplateVersions lists the versions of saved template name, oldest first.
func (c *Client) TemplateVersions(ctx context.Context, name string) ([]TemplateVersion, error) {
	var list api.TemplateVersionList
	if err := c.call(ctx, request{method: http.MethodGet, path: "/templates/" + url.PathEscape(name) + "/versions"}, &list); err != nil {
		return nil, wrapf(err, "listing versions of template %s", name)
	}
	return list.Versions, nil
}

// TemplateRef is the name of version v of template name ("name@v").
func TemplateRef(name string, v int) string { return name + "@" + strconv.Itoa(v) }
