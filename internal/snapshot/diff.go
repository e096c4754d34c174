package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	udiff "github.com/aymanbagabas/go-udiff"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/identity"
	"github.com/agentbox/agentbox/internal/layers"
)

// Diff.
//
// Every side of a diff is a stack of host directories, top-most first: a
// checkpoint's or template's layer chain, or for a live sandbox its upper
// directory over its layers. The sandbox's upper is read on the host while
// its lifecycle lock is held shared (no restore, checkpoint or delete
// meanwhile; its processes keep running, so a file being written shows in
// either state). Everything is read with lstat and O_NOFOLLOW below the
// layer roots: a symlink planted in a sandbox is reported, never followed.

// Unified diffs are made for text files up to this size (each side).
const (
	maxUnifiedFile  = 64 << 10
	maxUnifiedFiles = 200
)

// fsState is one resolved side of a diff.
type fsState struct {
	ref     string   // canonical: "sandbox:<id>", "checkpoint:<id>", "template:<name>"
	dirs    []string // top-most first
	sandbox string   // sandbox id for a sandbox ref
	release func()
}

// resolveState resolves ref (see api.Diff). A sandbox ref holds the
// sandbox's lifecycle lock shared until release is called.
func (m *Snapshots) resolveState(ctx context.Context, ref string) (fsState, error) {
	kind, name, ok := strings.Cut(ref, ":")
	if !ok {
		kind, name = "", ref
	}
	if name == "" || len(name) > 256 || strings.ContainsAny(name, "\x00/") {
		return fsState{}, fmt.Errorf("ref %q: want sandbox:<id>, checkpoint:<id|name> or template:<name>: %w", ref, errdefs.ErrInvalidArgument)
	}
	switch kind {
	case "sandbox":
		return m.sandboxState(ctx, name)
	case "checkpoint":
		return m.checkpointState(ctx, name)
	case "template":
		return m.templateState(ctx, name)
	case "":
		if s, err := m.sandboxState(ctx, name); !errdefs.IsNotFound(err) {
			return s, err
		}
		if s, err := m.checkpointState(ctx, name); !errdefs.IsNotFound(err) {
			return s, err
		}
		if s, err := m.templateState(ctx, name); !errdefs.IsNotFound(err) {
			return s, err
		}
		return fsState{}, fmt.Errorf("%q is no sandbox, checkpoint or template: %w", ref, errdefs.ErrNotFound)
	}
	return fsState{}, fmt.Errorf("ref %q: unknown kind %q (sandbox, checkpoint, template): %w", ref, kind, errdefs.ErrInvalidArgument)
}

func (m *Snapshots) sandboxState(ctx context.Context, id string) (fsState, error) {
	h, err := m.sbx.Handle(ctx, id)
	if err != nil {
		return fsState{}, err
	}
	dirs, release, err := h.ReadFS(ctx)
	if err != nil {
		return fsState{}, err
	}
	return fsState{ref: "sandbox:" + id, dirs: dirs, sandbox: id, release: release}, nil
}

func (m *Snapshots) checkpointState(ctx context.Context, ref string) (fsState, error) {
	_, ls, err := m.checkpoints()
	if err != nil {
		return fsState{}, err
	}
	rec, err := m.findCheckpointNamed(ctx, ref, nil)
	if err != nil {
		return fsState{}, err
	}
	dirs, err := ls.Paths(rec.Layer)
	if err != nil {
		return fsState{}, fmt.Errorf("checkpoint %s: %w", rec.Checkpoint.ID, err)
	}
	return fsState{ref: "checkpoint:" + rec.Checkpoint.ID, dirs: dirs, release: func() {}}, nil
}

func (m *Snapshots) templateState(ctx context.Context, name string) (fsState, error) {
	t, err := m.sbx.ResolveTemplate(ctx, name)
	if err != nil {
		return fsState{}, err
	}
	return fsState{ref: "template:" + t.Name, dirs: t.Layers, release: func() {}}, nil
}

// view computes the merged view of a resolved state.
func (m *Snapshots) view(ctx context.Context, s fsState) (*layers.View, error) {
	v, err := layers.MergedView(ctx, s.dirs, m.ids)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", s.ref, err)
	}
	return v, nil
}

// Diff compares two filesystem states (refs as in api.Diff). With
// opts.Unified, small text files get a unified diff; the identity files
// (internal/identity) are left out unless opts.IncludeIdentity.
func (m *Snapshots) Diff(ctx context.Context, fromRef, toRef string, opts api.DiffOptions) (api.Diff, error) {
	unified := opts.Unified
	from, err := m.resolveState(ctx, fromRef)
	if err != nil {
		return api.Diff{}, fmt.Errorf("diff: from: %w", err)
	}
	defer from.release()
	var to fsState
	if from.sandbox != "" && (toRef == from.ref || toRef == from.sandbox) {
		to = from // one lock, never taken twice
		to.release = func() {}
	} else if to, err = m.resolveState(ctx, toRef); err != nil {
		return api.Diff{}, fmt.Errorf("diff: to: %w", err)
	}
	defer to.release()
	fv, err := m.view(ctx, from)
	if err != nil {
		return api.Diff{}, fmt.Errorf("diff: %w", err)
	}
	tv, err := m.view(ctx, to)
	if err != nil {
		return api.Diff{}, fmt.Errorf("diff: %w", err)
	}
	changes, err := layers.Diff(ctx, fv, tv)
	if err != nil {
		return api.Diff{}, fmt.Errorf("diff: %w", err)
	}
	if !opts.IncludeIdentity {
		changes = withoutIdentity(changes)
	}
	out := api.Diff{From: from.ref, To: to.ref, Changes: make([]api.DiffChange, 0, len(changes))}
	nUnified := 0
	for _, c := range changes {
		dc, err := diffChange(c, c.Kind == layers.Modified)
		if err != nil {
			return api.Diff{}, fmt.Errorf("diff: %w", err)
		}
		switch c.Kind {
		case layers.Added:
			out.Added++
		case layers.Modified:
			out.Modified++
		case layers.Deleted:
			out.Deleted++
		}
		if unified && nUnified < maxUnifiedFiles && textCandidate(c) {
			if err := unifiedDiff(&dc, c); err != nil {
				return api.Diff{}, fmt.Errorf("diff: %w", err)
			}
			nUnified++
		}
		out.Changes = append(out.Changes, dc)
	}
	return out, nil
}

// diffChange is the wire form of c; withHash adds the content hashes of
// regular files.
func diffChange(c layers.Change, withHash bool) (api.DiffChange, error) {
	dc := api.DiffChange{Path: c.Path, Change: c.Kind}
	var err error
	if dc.From, err = fileMeta(c.Old, withHash); err != nil {
		return dc, err
	}
	if dc.To, err = fileMeta(c.New, withHash); err != nil {
		return dc, err
	}
	return dc, nil
}

func fileMeta(e *layers.Entry, withHash bool) (*api.FileMeta, error) {
	if e == nil {
		return nil, nil
	}
	fm := &api.FileMeta{Type: e.Type, Mode: e.Mode, UID: e.UID, GID: e.GID, Size: e.Size, Target: e.Target}
	if withHash && e.Type == layers.TypeFile {
		d, err := e.Digest()
		if err != nil {
			return nil, err
		}
		fm.SHA256 = d
	}
	return fm, nil
}

// textCandidate reports whether c is about regular files small enough for
// a unified diff.
func textCandidate(c layers.Change) bool {
	for _, e := range []*layers.Entry{c.Old, c.New} {
		if e != nil && (e.Type != layers.TypeFile || e.Size > maxUnifiedFile) {
			return false
		}
	}
	return true
}

// unifiedDiff fills dc.Unified (or dc.Binary) for the files of c.
func unifiedDiff(dc *api.DiffChange, c layers.Change) error {
	old, err := readSmall(c.Old)
	if err != nil {
		return err
	}
	cur, err := readSmall(c.New)
	if err != nil {
		return err
	}
	if !isText(old) || !isText(cur) {
		dc.Binary = true
		return nil
	}
	oldLabel, newLabel := "a"+c.Path, "b"+c.Path
	if c.Old == nil {
		oldLabel = "/dev/null"
	}
	if c.New == nil {
		newLabel = "/dev/null"
	}
	dc.Unified = udiff.Unified(oldLabel, newLabel, string(old), string(cur))
	return nil
}

func readSmall(e *layers.Entry) ([]byte, error) {
	if e == nil {
		return nil, nil
	}
	f, err := layers.OpenEntry(e)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxUnifiedFile+1))
}

// isText: valid UTF-8 without NUL bytes.
func isText(b []byte) bool { return !bytes.ContainsRune(b, 0) && utf8.Valid(b) }

// TreeHash returns the content hash of sandbox id's filesystem as seen
// from inside (layers.View.Hash), read on the host with its lifecycle lock
// held shared.
func (m *Snapshots) TreeHash(ctx context.Context, id string) (api.TreeHash, error) {
	s, err := m.sandboxState(ctx, id)
	if err != nil {
		return api.TreeHash{}, err
	}
	defer s.release()
	v, err := m.view(ctx, s)
	if err != nil {
		return api.TreeHash{}, fmt.Errorf("hashing sandbox %s: %w", id, err)
	}
	h, err := v.Hash(ctx)
	if err != nil {
		return api.TreeHash{}, fmt.Errorf("hashing sandbox %s: %w", id, err)
	}
	return api.TreeHash{TreeHash: h}, nil
}

// withoutIdentity returns changes (path order) without the identity files
// every fork gets fresh (identity.Files), and without the directories
// added or deleted only to hold them: each sandbox's identity is its own
// by design, not a change to show or merge.
func withoutIdentity(changes []layers.Change) []layers.Change {
	out := changes[:0:0]
	for _, c := range changes {
		if !identity.Is(c.Path) {
			out = append(out, c)
		}
	}
	// A directory that is an ancestor of an identity file, added or
	// deleted as a whole, with no other change below it.
	keep := out[:0]
	for i, c := range out {
		if c.Kind != layers.Modified && identityDir(c.Path) && !changedBelow(out[i+1:], c.Path) {
			continue
		}
		keep = append(keep, c)
	}
	return keep
}

// identityDir reports whether dir is a proper ancestor of an identity file.
func identityDir(dir string) bool {
	for _, f := range identity.Files {
		if strings.HasPrefix(f.Path, dir+"/") {
			return true
		}
	}
	return false
}

// changedBelow reports whether after (the changes following dir's, in
// path order) has a change below dir.
func changedBelow(after []layers.Change, dir string) bool {
	for _, c := range after {
		if strings.HasPrefix(c.Path, dir+"/") {
			return true
		}
	}
	return false
}
