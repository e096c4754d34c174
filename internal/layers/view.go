package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
)

// Entry types of a View.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeChar    = "char"
	TypeBlock   = "block"
	TypeFifo    = "fifo"
	TypeSocket  = "socket"
)

// Entry is one path of the merged view of a layer stack, as a process in a
// sandbox running on that stack sees it.
type Entry struct {
	Path   string // absolute inside the sandbox ("/", "/etc/passwd")
	Type   string // one of the Type* constants
	Mode   uint32 // permission bits with setuid, setgid and sticky (07777)
	UID    int64  // owner inside the sandbox
	GID    int64  // group inside the sandbox
	Size   int64  // regular files
	Target string // symlink target, never followed
	Rdev   uint64 // devices

	// HostPath is the host file the entry comes from (in the top-most
	// layer that has it); read it only with O_NOFOLLOW.
	HostPath string
	digest   string // sha256 of a regular file's content, computed lazily
}

// Digest returns the hex sha256 of a regular file's content (computed on
// first use and cached), "" for other types.
func (e *Entry) Digest() (string, error) {
	if e.Type != TypeFile || e.digest != "" {
		return e.digest, nil
	}
	f, err := OpenEntry(e)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", e.Path, err)
	}
	if n != e.Size {
		return "", fmt.Errorf("%s changed while it was read: %w", e.Path, errdefs.ErrConflict)
	}
	e.digest = hex.EncodeToString(h.Sum(nil))
	return e.digest, nil
}

// OpenEntry opens a regular file entry for reading without following a
// symlink (a file replaced by a symlink since the view was taken fails).
func OpenEntry(e *Entry) (*os.File, error) {
	if e.Type != TypeFile {
		return nil, fmt.Errorf("%s is a %s, not a file: %w", e.Path, e.Type, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(e.HostPath, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", e.Path, err)
	}
	return f, nil
}

// View is the merged view of a stack of layer directories: what overlayfs
// shows for those lower directories (top-most first), with whiteouts and
// opaque directories applied.
type View struct {
	entries map[string]*Entry
}

// Get returns the entry at an absolute path, or nil.
func (v *View) Get(path string) *Entry { return v.entries[path] }

// Len is the number of entries (the root included).
func (v *View) Len() int { return len(v.entries) }

// Paths returns every path of the view in lexical order of their
// components (a directory comes right before its contents).
func (v *View) Paths() []string {
	out := make([]string, 0, len(v.entries))
	for p := range v.entries {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePaths)
	return out
}

// comparePaths orders paths component by component, so "/a/b" sorts
// before "/a.b" and every directory before its contents.
func comparePaths(a, b string) int {
	return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
}

// MergedView computes the merged view of dirs, top-most first (for a
// running sandbox: its upper directory, then its lower layers). Every
// entry is read with lstat: symlinks are never followed, and nothing
// outside dirs is touched. Owners are translated to ids inside the sandbox
// by ids (a zero ids keeps host ids); an owner outside the map is reported
// as the overflow id 65534.
//
// The upper directory of a running sandbox may be read while the sandbox
// runs; files that change meanwhile are seen in either state (or fail a
// later Digest with errdefs.ErrConflict).
func MergedView(ctx context.Context, dirs []string, ids idrange.IDMap) (*View, error) {
	v := &View{entries: map[string]*Entry{}}
	// hidden: entries of higher layers that hide everything below them at
	// their path (whiteouts and non-directories); opaque: directories of
	// higher layers whose lower contents are hidden.
	hidden := map[string]bool{}
	opaqueDirs := map[string]bool{}
	for i, dir := range dirs {
		seenHere := map[string]bool{}
		err := filepath.WalkDir(dir, func(host string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) && host != dir {
					return nil // removed while walking (a live upper)
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, host)
			if err != nil {
				return err
			}
			p := "/"
			if rel != "." {
				p = "/" + filepath.ToSlash(rel)
			}
			isDir := d.IsDir()
			skip := func() error {
				if isDir {
					return filepath.SkipDir
				}
				return nil
			}
			if hidden[p] {
				return skip()
			}
			if prev := v.entries[p]; prev != nil {
				// A higher layer has this path.
				if prev.Type != TypeDir || !isDir {
					return skip()
				}
				if opaqueDirs[p] && !seenHere[p] {
					return filepath.SkipDir
				}
				seenHere[p] = true
				if i < len(dirs)-1 && opaque(host) {
					opaqueDirs[p] = true // hides what lies below this layer
				}
				return nil
			}
			var st unix.Stat_t
			if err := unix.Lstat(host, &st); err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil
				}
				return &os.PathError{Op: "lstat", Path: host, Err: err}
			}
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
				hidden[p] = true // whiteout
				return nil
			}
			e := &Entry{Path: p, Mode: st.Mode & 0o7777, Rdev: st.Rdev, HostPath: host}
			e.UID, e.GID = insideID(int64(st.Uid), ids), insideID(int64(st.Gid), ids)
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				e.Type, e.Rdev = TypeDir, 0
				seenHere[p] = true
				if i < len(dirs)-1 && opaque(host) {
					opaqueDirs[p] = true
				}
			case unix.S_IFREG:
				e.Type, e.Size, e.Rdev = TypeFile, st.Size, 0
			case unix.S_IFLNK:
				target, err := os.Readlink(host)
				if err != nil {
					return err
				}
				e.Type, e.Target, e.Rdev = TypeSymlink, target, 0
			case unix.S_IFCHR:
				e.Type = TypeChar
			case unix.S_IFBLK:
				e.Type = TypeBlock
			case unix.S_IFIFO:
				e.Type, e.Rdev = TypeFifo, 0
			case unix.S_IFSOCK:
				e.Type, e.Rdev = TypeSocket, 0
			default:
				return nil
			}
			v.entries[p] = e
			if e.Type != TypeDir {
				hidden[p] = true
			}
			return nil
		})
		if err != nil && !(errors.Is(err, fs.ErrNotExist) && i == 0 && len(dirs) > 1) {
			return nil, fmt.Errorf("reading layer %d of %d: %w", i+1, len(dirs), err)
		}
	}
	return v, nil
}

// overflowID is the id a file owned outside the sandbox's map shows as.
const overflowID = 65534

func insideID(host int64, ids idrange.IDMap) int64 {
	if ids.Size == 0 {
		return host
	}
	in := host - int64(ids.HostID)
	if in < 0 || in >= int64(ids.Size) {
		return overflowID
	}
	return in
}

// Hash returns a content hash of the view: sha256 over every entry in
// path order with its type, permission bits, owner, group and, per type,
// the content hash of a file, the target of a symlink or the number of a
// device. Modification times, xattrs and hardlink structure are not part
// of it. Two views with the same Hash look byte-identical from inside a
// sandbox; a sandbox's Hash equals its template's as long as nothing was
// changed.
func (v *View) Hash(ctx context.Context) (string, error) {
	h := sha256.New()
	for _, p := range v.Paths() {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		e := v.entries[p]
		fmt.Fprintf(h, "%q %s %o %d %d", p, e.Type, e.Mode, e.UID, e.GID)
		switch e.Type {
		case TypeFile:
			d, err := e.Digest()
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, " %d %s", e.Size, d)
		case TypeSymlink:
			fmt.Fprintf(h, " %q", e.Target)
		case TypeChar, TypeBlock:
			fmt.Fprintf(h, " %d:%d", unix.Major(e.Rdev), unix.Minor(e.Rdev))
		}
		h.Write([]byte("\n"))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
