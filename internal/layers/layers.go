// Package layers is the store of immutable filesystem layers that sandboxes
// stack as read-only overlayfs lower directories.
//
// A layer is a plain host directory whose files are owned by the host ids of
// the sandbox user namespace (idrange.IDMap: sandbox uid N is host uid
// HostID+N). Overlay metadata inside a layer uses the unprivileged
// ("userxattr") form: whiteouts are character devices 0:0 and opaque
// directories carry the xattr user.overlay.opaque=y. A layer produced by a
// build step is simply the overlay upper directory of a throwaway sandbox.
//
// The store is modelled on containerd's snapshotter: layers are immutable,
// content addressed and created atomically.
//
//   - Identity: a layer's Digest is TreeHash of its own content. Its ID is the
//     Digest for a base layer and sha256(parent ID, Digest) for a layer on top
//     of a parent (like an OCI chain id), so one ID names the content of the
//     whole stack below it and equal stacks share one directory.
//   - Atomicity: a layer is built in <root>/tmp, synced, renamed to
//     <root>/<first 12 hex of ID>, and becomes visible only when its metadata
//     file <root>/<first 12 hex>.json has been written atomically. New removes
//     every leftover of an interrupted creation (tmp content, directories
//     without metadata). Paths are kept short because classic overlay mount
//     options must fit in one 4 KiB page.
//   - Lifetime: a layer cannot be removed while another layer builds on it or
//     while an owner (for example a template) holds a reference (Ref).
//
// All methods of Store are safe for concurrent use.
package layers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/idrange"
)

// shortLen is the length of the directory name of a layer (hex digits of its
// ID). 48 bits keep collisions negligible; a collision is detected, never
// silently merged.
const shortLen = 12

// tmpName is the store's scratch directory, emptied by New.
const tmpName = "tmp"

// Layer describes one immutable layer.
type Layer struct {
	ID        string    `json:"id"`               // chain id: identifies this layer and all below it
	Digest    string    `json:"digest"`           // TreeHash of this layer's own directory
	Parent    string    `json:"parent,omitempty"` // ID of the layer below, "" for a base layer
	Path      string    `json:"-"`                // host directory (an overlay lowerdir)
	Size      int64     `json:"size"`             // bytes allocated on disk (hardlinks counted once)
	CreatedAt time.Time `json:"created_at"`
	Refs      []string  `json:"refs,omitempty"` // owners that keep the layer alive (sorted)

	used time.Time // last lookup in this process (see GCOptions.MinAge)
}

// CreateOptions are options of the layer-creating methods.
type CreateOptions struct {
	// Parent is the ID of the layer the new one is stacked on ("" for a
	// base layer). It must exist.
	Parent string
}

// Store manages the layers under one root directory.
type Store struct {
	root   string
	ids    idrange.IDMap
	log    *slog.Logger
	driver Driver // see driver.go

	maxDepth   int    // see Bound; 0: DefaultMaxDepth
	driverName string // see WithDriverName

	// mu guards layers and every metadata file write.
	mu     sync.Mutex
	layers map[string]*Layer // by ID
}

// New opens (creating if needed) the store at root. Files in its layers are
// owned by host ids in ids. New removes leftovers of interrupted creations.
//
// New creates root with mode 0700: layers are read by host root only (the
// native backend mounts them and hands the guest the mount).
//
// The storage driver is probed on root's filesystem (see ProbeDriver)
// unless an Option chooses one.
func New(root string, ids idrange.IDMap, opts ...Option) (*Store, error) {
	if ids.Size == 0 {
		return nil, fmt.Errorf("layer store %s: empty id map: %w", root, errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("layer store %s: %w", root, err)
	}
	s := &Store{root: root, ids: ids, layers: map[string]*Layer{}}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "layers")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("creating layer store: %w", err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("creating layer store: %w", err)
	}
	// Leftovers of interrupted creations and removals.
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("cleaning layer store tmp: %w", err)
	}
	if err := os.Mkdir(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating layer store tmp: %w", err)
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	if s.driver == nil {
		if s.driver, err = DriverByName(s.driverName, s.tmpDir()); err != nil {
			return nil, err
		}
	}
	s.log.Debug("layer store opened", "driver", s.driver.Name(), "fs", s.driver.Features().Filesystem)
	return s, nil
}

func (s *Store) tmpDir() string { return filepath.Join(s.root, tmpName) }

func (s *Store) dirOf(id string) string  { return filepath.Join(s.root, id[:shortLen]) }
func (s *Store) metaOf(id string) string { return filepath.Join(s.root, id[:shortLen]+".json") }

// load reads every metadata file and removes directories that have none.
func (s *Store) load() error {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("reading layer store: %w", err)
	}
	withMeta := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") { // renameio temp files
			_ = os.Remove(filepath.Join(s.root, name))
			continue
		}
		short, ok := strings.CutSuffix(name, ".json")
		if !ok || e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.root, name))
		if err != nil {
			return fmt.Errorf("reading layer metadata %s: %w", name, err)
		}
		var l Layer
		if err := json.Unmarshal(data, &l); err != nil || len(l.ID) != 64 || l.ID[:shortLen] != short {
			s.log.Warn("removing corrupt layer metadata", "file", name, "err", err)
			_ = os.Remove(filepath.Join(s.root, name))
			continue
		}
		l.Path = s.dirOf(l.ID)
		if fi, err := os.Lstat(l.Path); err != nil || !fi.IsDir() {
			s.log.Warn("removing metadata of missing layer", "id", l.ID)
			_ = os.Remove(filepath.Join(s.root, name))
			continue
		}
		withMeta[short] = true
		s.layers[l.ID] = &l
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == tmpName || withMeta[e.Name()] {
			continue
		}
		// Renamed into place but metadata never written: a crash mid-commit.
		s.log.Warn("removing layer directory without metadata", "dir", e.Name())
		if err := os.RemoveAll(filepath.Join(s.root, e.Name())); err != nil {
			return fmt.Errorf("removing incomplete layer %s: %w", e.Name(), err)
		}
	}
	return nil
}

// Root returns the store's root directory.
func (s *Store) Root() string { return s.root }

// IDs returns the id map the store's layers are owned by.
func (s *Store) IDs() idrange.IDMap { return s.ids }

// TreeHash is TreeHash(dir, s.IDs()).
func (s *Store) TreeHash(dir string) (string, error) { return TreeHash(dir, s.ids) }

// TempDir creates an empty scratch directory (mode 0711) on the store's
// filesystem, so that it can later be adopted by CreateFromDir with a cheap
// rename. The caller removes it when it is not adopted; New removes any
// left over.
func (s *Store) TempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp(s.tmpDir(), prefix)
	if err != nil {
		return "", fmt.Errorf("creating scratch dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("creating scratch dir: %w", err)
	}
	return dir, nil
}

// Get returns the layer with the given ID (or unique ID prefix of at least
// 12 hex digits). It fails with errdefs.ErrNotFound.
func (s *Store) Get(id string) (Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.getLocked(id)
	if err != nil {
		return Layer{}, err
	}
	return l.clone(), nil
}

func (s *Store) getLocked(id string) (*Layer, error) {
	if l, ok := s.layers[id]; ok {
		l.used = time.Now()
		return l, nil
	}
	if len(id) >= shortLen {
		for full, l := range s.layers {
			if strings.HasPrefix(full, id) {
				l.used = time.Now()
				return l, nil
			}
		}
	}
	return nil, fmt.Errorf("layer %q: %w", id, errdefs.ErrNotFound)
}

func (l *Layer) clone() Layer {
	c := *l
	c.Refs = slices.Clone(l.Refs)
	return c
}

// List returns all layers sorted by creation time (oldest first).
func (s *Store) List() []Layer {
	s.mu.Lock()
	out := make([]Layer, 0, len(s.layers))
	for _, l := range s.layers {
		out = append(out, l.clone())
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Layer) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Chain returns the layer id and every layer below it, top-most first.
func (s *Store) Chain(id string) ([]Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Layer
	for cur := id; cur != ""; {
		l, err := s.getLocked(cur)
		if err != nil {
			return nil, fmt.Errorf("resolving chain of layer %s: %w", id, err)
		}
		out = append(out, l.clone())
		cur = l.Parent
	}
	return out, nil
}

// Paths returns the host directories of the chain of id, top-most first:
// ready to be used as overlay lowerdirs.
func (s *Store) Paths(id string) ([]string, error) {
	chain, err := s.Chain(id)
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(chain))
	for i, l := range chain {
		paths[i] = l.Path
	}
	return paths, nil
}

// DiskUsage returns the bytes allocated by all layers.
func (s *Store) DiskUsage(ctx context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, l := range s.layers {
		n += l.Size
	}
	return n, ctx.Err()
}

// Ref records that owner (an opaque string such as "template/busybox") uses
// layer id, which then cannot be removed until Unref. Idempotent.
func (s *Store) Ref(ctx context.Context, id, owner string) error {
	return s.updateRefs(id, func(refs []string) []string {
		if slices.Contains(refs, owner) {
			return refs
		}
		refs = append(refs, owner)
		slices.Sort(refs)
		return refs
	})
}

// Unref drops owner's reference on layer id. Idempotent; a missing layer is
// not an error.
func (s *Store) Unref(ctx context.Context, id, owner string) error {
	err := s.updateRefs(id, func(refs []string) []string {
		return slices.DeleteFunc(refs, func(r string) bool { return r == owner })
	})
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

func (s *Store) updateRefs(id string, f func([]string) []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.getLocked(id)
	if err != nil {
		return err
	}
	n := l.clone()
	n.Refs = f(n.Refs)
	if slices.Equal(n.Refs, l.Refs) {
		return nil
	}
	if err := s.writeMetaLocked(&n); err != nil {
		return err
	}
	l.Refs = n.Refs
	return nil
}

// Remove deletes layer id. It fails with errdefs.ErrConflict while the layer
// is referenced or another layer is stacked on it.
func (s *Store) Remove(ctx context.Context, id string) error {
	return s.remove(ctx, id, nil)
}

// remove deletes layer id unless it is referenced, has layers stacked on
// it, or check (called with s.mu held) fails.
func (s *Store) remove(ctx context.Context, id string, check func(*Layer) error) error {
	s.mu.Lock()
	l, ok := s.layers[id] // not getLocked: a removal is no use
	if !ok {
		var err error
		if l, err = s.getLocked(id); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	if len(l.Refs) > 0 {
		s.mu.Unlock()
		return fmt.Errorf("removing layer %s: referenced by %s: %w", l.ID, strings.Join(l.Refs, ", "), errdefs.ErrConflict)
	}
	for _, o := range s.layers {
		if o.Parent == l.ID {
			s.mu.Unlock()
			return fmt.Errorf("removing layer %s: layer %s is stacked on it: %w", l.ID, o.ID, errdefs.ErrConflict)
		}
	}
	if check != nil {
		if err := check(l); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	// Metadata first: once it is gone the layer is invisible, and a
	// directory without metadata is removed by New after a crash.
	if err := os.Remove(s.metaOf(l.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.mu.Unlock()
		return fmt.Errorf("removing layer %s: %w", l.ID, err)
	}
	delete(s.layers, l.ID)
	graveyard, err := os.MkdirTemp(s.tmpDir(), "rm-")
	if err == nil {
		err = os.Rename(l.Path, filepath.Join(graveyard, "l"))
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("removing layer %s: %w", l.ID, err)
	}
	if err := os.RemoveAll(graveyard); err != nil {
		return fmt.Errorf("removing layer %s: %w", l.ID, err)
	}
	return nil
}

// CreateFromDir adopts src (for example the overlay upper directory of a
// finished build step) as a new immutable layer on top of opts.Parent. src
// is consumed: it is renamed into the store when it lives on the store's
// filesystem, else copied (ownership, modes, xattrs, whiteouts and hardlinks
// preserved) and then removed. Every file in src must be owned by an id of
// the store's map (errdefs.ErrInvalidArgument otherwise). When an identical
// layer exists already, it is returned and src is discarded.
func (s *Store) CreateFromDir(ctx context.Context, src string, opts CreateOptions) (Layer, error) {
	fi, err := os.Lstat(src)
	if err != nil {
		return Layer{}, fmt.Errorf("creating layer from %s: %w", src, err)
	}
	if !fi.IsDir() {
		return Layer{}, fmt.Errorf("creating layer from %s: not a directory: %w", src, errdefs.ErrInvalidArgument)
	}
	holder, err := s.TempDir("adopt-")
	if err != nil {
		return Layer{}, err
	}
	defer os.RemoveAll(holder)
	dst := filepath.Join(holder, "l")
	if err := os.Rename(src, dst); err != nil {
		if !errors.Is(err, unix.EXDEV) {
			return Layer{}, fmt.Errorf("creating layer from %s: %w", src, err)
		}
		if err := s.driver.Clone(ctx, src, dst); err != nil {
			return Layer{}, fmt.Errorf("creating layer from %s: %w", src, err)
		}
		if err := os.RemoveAll(src); err != nil {
			return Layer{}, fmt.Errorf("creating layer from %s: removing source: %w", src, err)
		}
	}
	return s.commit(ctx, dst, opts)
}

// ImportPath creates a layer holding a copy of the host path src at the
// absolute path dst inside the layer, on top of opts.Parent. Missing parent
// directories of dst are created (0755). Everything is owned by the mapped
// root; permission bits are kept. Symlinks in src are copied as symlinks,
// never followed (src itself included); devices, fifos and sockets are
// skipped. When src is a directory its contents land in dst.
func (s *Store) ImportPath(ctx context.Context, src, dst string, opts CreateOptions) (Layer, error) {
	rel, err := cleanAbs(dst)
	if err != nil {
		return Layer{}, fmt.Errorf("importing %s: %w", src, err)
	}
	if rel == "." {
		return Layer{}, fmt.Errorf("importing %s: destination must not be /: %w", src, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(src); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Layer{}, fmt.Errorf("importing %s: %w", src, errdefs.ErrNotFound)
		}
		return Layer{}, fmt.Errorf("importing %s: %w", src, err)
	}
	holder, err := s.TempDir("import-")
	if err != nil {
		return Layer{}, err
	}
	defer os.RemoveAll(holder)
	layer := filepath.Join(holder, "l")
	uid, gid := int(s.ids.HostID), int(s.ids.HostID)
	// Parent directories: the layer root and every component of dst's dir.
	dirs := []string{layer}
	for p := filepath.Dir(rel); p != "."; p = filepath.Dir(p) {
		dirs = append(dirs, filepath.Join(layer, p))
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return Layer{}, fmt.Errorf("importing %s: %w", src, err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return Layer{}, err
		}
		if err := os.Lchown(d, uid, gid); err != nil {
			return Layer{}, fmt.Errorf("importing %s: %w", src, err)
		}
	}
	if err := copyTree(ctx, src, filepath.Join(layer, rel), copyOptions{uid: uid, gid: gid}); err != nil {
		return Layer{}, fmt.Errorf("importing %s: %w", src, err)
	}
	return s.commit(ctx, layer, opts)
}

// cleanAbs validates an absolute path inside a layer and returns it relative
// to the layer root ("." for /). ".." components are refused.
func cleanAbs(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q contains '..': %w", p, errdefs.ErrInvalidArgument)
		}
	}
	if c := filepath.Clean(p); c != "/" {
		return c[1:], nil
	}
	return ".", nil
}

// commit turns the finished directory dir (inside the store's tmp) into a
// visible layer.
func (s *Store) commit(ctx context.Context, dir string, opts CreateOptions) (Layer, error) {
	if opts.Parent != "" {
		p, err := s.Get(opts.Parent)
		if err != nil {
			return Layer{}, fmt.Errorf("creating layer: parent: %w", err)
		}
		opts.Parent = p.ID
	}
	digest, size, err := hashTree(ctx, dir, s.ids)
	if err != nil {
		return Layer{}, fmt.Errorf("creating layer: %w", err)
	}
	id := digest
	if opts.Parent != "" {
		sum := sha256.Sum256([]byte(opts.Parent + " " + digest))
		id = hex.EncodeToString(sum[:])
	}
	// Make the content durable before it becomes visible.
	if err := syncFS(dir); err != nil {
		return Layer{}, fmt.Errorf("creating layer: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.layers[id]; ok {
		l.used = time.Now()
		return l.clone(), nil // identical layer exists; the caller removes dir
	}
	l := &Layer{ID: id, Digest: digest, Parent: opts.Parent, Path: s.dirOf(id), Size: size, CreatedAt: time.Now().UTC(), used: time.Now()}
	if _, err := os.Lstat(l.Path); err == nil {
		return Layer{}, fmt.Errorf("creating layer %s: directory %s taken by another layer: %w", id, l.Path, errdefs.ErrInternal)
	}
	if err := os.Rename(dir, l.Path); err != nil {
		return Layer{}, fmt.Errorf("creating layer %s: %w", id, err)
	}
	if err := syncDir(s.root); err != nil {
		_ = os.Rename(l.Path, dir)
		return Layer{}, fmt.Errorf("creating layer %s: %w", id, err)
	}
	if err := s.writeMetaLocked(l); err != nil {
		_ = os.Rename(l.Path, dir)
		return Layer{}, err
	}
	s.layers[id] = l
	s.log.Debug("layer created", "id", id, "parent", opts.Parent, "size", size)
	return l.clone(), nil
}

func (s *Store) writeMetaLocked(l *Layer) error {
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return fmt.Errorf("writing layer metadata %s: %w", l.ID, err)
	}
	if err := renameio.WriteFile(s.metaOf(l.ID), data, 0o600); err != nil {
		return fmt.Errorf("writing layer metadata %s: %w", l.ID, err)
	}
	if err := syncDir(s.root); err != nil {
		return fmt.Errorf("writing layer metadata %s: %w", l.ID, err)
	}
	return nil
}

// syncFS flushes the filesystem holding path (one syncfs instead of an
// fsync per file of a large tree).
func syncFS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &os.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
