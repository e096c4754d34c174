package layers

import (
	"context"
	"slices"
)

// Kinds of a Change.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Change is one path that differs between two views.
type Change struct {
	Path string
	Kind string // Added, Modified or Deleted
	Old  *Entry // nil when added
	New  *Entry // nil when deleted
}

// Diff compares two views and returns the changes that turn from into to,
// in path order (a directory before its contents). A path is modified when
// its type, permission bits, owner, group, symlink target or device number
// differ, or for regular files when size or content (sha256) differ;
// directories differ only by their own metadata. Content is hashed only
// when sizes are equal and the two entries come from different host files.
func Diff(ctx context.Context, from, to *View) ([]Change, error) {
	var out []Change
	for p, n := range to.entries {
		o := from.entries[p]
		if o == nil {
			out = append(out, Change{Path: p, Kind: Added, New: n})
			continue
		}
		same, err := SameEntry(o, n)
		if err != nil {
			return nil, err
		}
		if !same {
			out = append(out, Change{Path: p, Kind: Modified, Old: o, New: n})
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for p, o := range from.entries {
		if to.entries[p] == nil {
			out = append(out, Change{Path: p, Kind: Deleted, Old: o})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return comparePaths(a.Path, b.Path) })
	return out, nil
}

// SameEntry reports whether a and b look identical from inside a sandbox
// (see Diff).
func SameEntry(a, b *Entry) (bool, error) {
	if a.Type != b.Type || a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID {
		return false, nil
	}
	switch a.Type {
	case TypeFile:
		if a.Size != b.Size {
			return false, nil
		}
		if a.HostPath == b.HostPath {
			return true, nil
		}
		da, err := a.Digest()
		if err != nil {
			return false, err
		}
		db, err := b.Digest()
		if err != nil {
			return false, err
		}
		return da == db, nil
	case TypeSymlink:
		return a.Target == b.Target, nil
	case TypeChar, TypeBlock:
		return a.Rdev == b.Rdev, nil
	}
	return true, nil
}
