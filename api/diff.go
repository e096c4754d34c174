package api

import "time"

// Diff, merge and saved templates (issue 3, items 4, 5 and 8).
//
// A ref names a filesystem state: "sandbox:<id|name>" (its live state),
// "checkpoint:<id or name>", "template:<name>[@<version>]". A bare ref is
// tried as a sandbox id, then a checkpoint id, then a template name.

// FileMeta is the metadata of one side of a changed path.
type FileMeta struct {
	Type   string `json:"type"` // file, dir, symlink, char, block, fifo, socket
	Mode   uint32 `json:"mode"` // permission bits with setuid/setgid/sticky (07777)
	UID    int64  `json:"uid"`  // inside the sandbox
	GID    int64  `json:"gid"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // regular files
	Target string `json:"target,omitempty"` // symlinks
}

// Change kinds of a DiffChange.
const (
	ChangeAdded    = "added"
	ChangeModified = "modified"
	ChangeDeleted  = "deleted"
)

// DiffChange is one path that differs between the two sides of a diff.
type DiffChange struct {
	Path   string    `json:"path"`
	Change string    `json:"change"`         // added, modified or deleted
	From   *FileMeta `json:"from,omitempty"` // absent when added
	To     *FileMeta `json:"to,omitempty"`   // absent when deleted
	// Unified is a unified text diff of a small text file (when asked for);
	// Binary is set instead for files that are not text.
	Unified string `json:"unified,omitempty"`
	Binary  bool   `json:"binary,omitempty"`
}

// Diff is the body of GET /v1/diff.
type Diff struct {
	From     string       `json:"from"` // the refs as resolved, e.g. "checkpoint:<id>"
	To       string       `json:"to"`
	Changes  []DiffChange `json:"changes"` // path order, a directory before its contents
	Added    int          `json:"added"`
	Modified int          `json:"modified"`
	Deleted  int          `json:"deleted"`
}

// DiffOptions are the options of GET /v1/diff (query parameters unified
// and include_identity).
type DiffOptions struct {
	// Unified adds a unified diff of each small text file.
	Unified bool
	// IncludeIdentity keeps the identity files every fork and pooled
	// sandbox gets fresh (/etc/machine-id, /var/lib/systemd/random-seed;
	// internal/identity) in the diff; they are left out by default.
	IncludeIdentity bool
}

// TreeHash is the body of GET /v1/sandboxes/{id}/treehash: the content hash
// of the sandbox's whole filesystem as seen from inside (paths, types,
// modes, owners, contents, symlink targets; not times), comparable with a
// template version's TreeHash.
type TreeHash struct {
	TreeHash string `json:"tree_hash"`
}

// Merge strategies and per-path resolutions.
const (
	MergeFail   = "fail"   // conflicts fail the merge (409); the default
	MergeOurs   = "ours"   // conflicts keep the target's version
	MergeTheirs = "theirs" // conflicts take the source's version
)

// MergeRequest is the body of POST /v1/sandboxes/{id}/merge: apply the
// changes sandbox From made since its common ancestor with the target
// (the checkpoint one was forked from) to the target sandbox.
type MergeRequest struct {
	From        string            `json:"from"`                  // source sandbox id
	Strategy    string            `json:"strategy,omitempty"`    // fail (default), ours, theirs
	Resolutions map[string]string `json:"resolutions,omitempty"` // path -> ours|theirs, overrides Strategy
	DryRun      bool              `json:"dry_run,omitempty"`     // report, apply nothing
	// IncludeIdentity merges the identity files every fork gets fresh
	// (/etc/machine-id, /var/lib/systemd/random-seed) like any other
	// path; by default they are left out, so each sandbox keeps its own.
	IncludeIdentity bool `json:"include_identity,omitempty"`
}

// MergeConflict is a path both sides changed differently since the base.
type MergeConflict struct {
	Path   string    `json:"path"`
	Base   *FileMeta `json:"base,omitempty"`   // absent when neither had it at the base
	Ours   *FileMeta `json:"ours,omitempty"`   // the target's; absent when it deleted it
	Theirs *FileMeta `json:"theirs,omitempty"` // the source's; absent when it deleted it
}

// MergeResult is the body of a successful merge (200), and of a refused one
// (409, with the fields of Error).
type MergeResult struct {
	Base      string          `json:"base"`      // checkpoint id of the common ancestor
	Applied   []DiffChange    `json:"applied"`   // changes written to the target
	Conflicts []MergeConflict `json:"conflicts"` // all conflicts found, resolved or not
	// Checkpoint is the checkpoint of the target taken before the changes
	// were applied (a failed merge restored it); empty for a dry run.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// MergeConflictError is the body of a 409 answer to a merge with
// unresolved conflicts: an Error plus the conflicts. Nothing was applied.
type MergeConflictError struct {
	Error
	Conflicts []MergeConflict `json:"conflicts"`
}

// SaveTemplateRequest is the body of POST /v1/sandboxes/{id}/template:
// freeze the sandbox's filesystem as a new version of template Name.
type SaveTemplateRequest struct {
	Name string `json:"name"`
}

// TemplateVersion is one immutable saved version of a template. Every
// sandbox created from it starts with a filesystem whose tree hash is
// TreeHash.
type TemplateVersion struct {
	Name      string            `json:"name"`
	Version   int               `json:"version"` // 1, 2, ...; address it as NAME@VERSION
	ID        string            `json:"id"`      // content id (top layer); NAME@<id prefix> works too
	TreeHash  string            `json:"tree_hash"`
	Source    string            `json:"source,omitempty"` // sandbox it was saved from
	SizeBytes int64             `json:"size_bytes"`
	Env       map[string]string `json:"env,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

// TemplateVersionList is the body of GET /v1/templates/{name}/versions.
type TemplateVersionList struct {
	Versions []TemplateVersion `json:"versions"`
}
