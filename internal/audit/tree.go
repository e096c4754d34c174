package audit

import (
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// A tree is the tracker's view of one upper directory (fanotify.go): a
// baseline (the state of every entry as of the last time the tracker
// folded its changes in) and the paths events named since. The files a
// run changed are the dirty paths whose state now differs from the
// baseline: the same answer as diffListings over two full walks, as long
// as every change to an entry names it, an ancestor directory of it that
// was created, moved or deleted, or its inode (see collect). Cost per
// run: the dirty paths and the subtrees of directories that appeared or
// went; never the whole layer.
type tree struct {
	upper   string // canonical host path
	fs      fsid   // its filesystem
	rootIno uint64

	// tooBig says its baseline would exceed scanLimits.Tracked entries:
	// it is not tracked (every run walks, bounded as without tracker).
	tooBig bool
	// built says the baseline was listed; files is it, by path relative
	// to upper; kids indexes it by parent directory ("" the top) and inos
	// its non-directories by inode number (hard links: a change through
	// one name changes the others).
	built bool
	files map[string]fileState
	kids  map[string]map[string]struct{}
	inos  map[uint64][]string

	// Guarded by the tracker's mu (the reader adds, collect takes):
	// dirty are paths events named (true: the entry itself was created,
	// deleted or moved), dirtyInos the inodes of events that
	// named no path, lost says events may have been missed (a queue
	// overflow, the upper dir itself moved or deleted): the baseline
	// must be checked against a full walk. gen counts the directory
	// moves and deletions in the tree: a directory's cached location
	// from an earlier gen is looked up again.
	dirty     map[string]bool
	dirtyInos map[uint64]struct{}
	lost      bool
	gen       uint64
}

func newTree(upper string) *tree {
	return &tree{upper: upper, files: map[string]fileState{}, kids: map[string]map[string]struct{}{},
		inos: map[uint64][]string{}, dirty: map[string]bool{}, dirtyInos: map[uint64]struct{}{}}
}

// setBaseline replaces the baseline with l.
func (t *tree) setBaseline(l listing) {
	t.files = map[string]fileState{}
	t.kids = map[string]map[string]struct{}{}
	t.inos = map[uint64][]string{}
	for rel, st := range l.files {
		t.put(rel, st)
	}
	t.built = true
}

// listing returns the baseline as a listing (for the fallback's diff).
func (t *tree) listing() listing {
	l := listing{files: make(map[string]fileState, len(t.files))}
	for rel, st := range t.files {
		l.files[rel] = st
	}
	return l
}

// put records rel's state in the baseline.
func (t *tree) put(rel string, st fileState) {
	if old, ok := t.files[rel]; ok {
		t.unindexIno(rel, old)
	}
	t.files[rel] = st
	dir, name := splitRel(rel)
	k := t.kids[dir]
	if k == nil {
		k = map[string]struct{}{}
		t.kids[dir] = k
	}
	k[name] = struct{}{}
	if !st.mode.IsDir() {
		t.inos[st.ino] = append(t.inos[st.ino], rel)
	}
}

// drop removes rel from the baseline.
func (t *tree) drop(rel string) {
	old, ok := t.files[rel]
	if !ok {
		return
	}
	t.unindexIno(rel, old)
	delete(t.files, rel)
	dir, name := splitRel(rel)
	if k := t.kids[dir]; k != nil {
		delete(k, name)
		if len(k) == 0 {
			delete(t.kids, dir)
		}
	}
}

func (t *tree) unindexIno(rel string, st fileState) {
	if st.mode.IsDir() {
		return
	}
	names := t.inos[st.ino]
	for i, n := range names {
		if n == rel {
			names = append(names[:i], names[i+1:]...)
			break
		}
	}
	if len(names) == 0 {
		delete(t.inos, st.ino)
	} else {
		t.inos[st.ino] = names
	}
}

func splitRel(rel string) (dir, name string) {
	dir, name = path.Split(rel)
	if dir != "" {
		dir = dir[:len(dir)-1]
	}
	return dir, name
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// collect compares the paths in dirty (and the inodes in inos) with
// their state on disk now, folds the differences into the baseline and
// returns them, sorted by path. It follows from each dirty path to
// what its change may have changed without an event of its own: the
// entries below a directory that appeared (moved in: they were never
// named) or went, and the other names of a file's inode. A directory
// whose entry was replaced (dirty[p] true) is taken as another one, even
// with the same inode number (a number is reused).
func (t *tree) collect(dirty map[string]bool, inos map[uint64]struct{}) []fileChange {
	// force: below a directory taken as another one, every entry is
	// (what happened below it while it was elsewhere has no event under
	// this path).
	type item struct {
		p     string
		force bool
	}
	queue := make([]item, 0, len(dirty))
	for p := range dirty {
		queue = append(queue, item{p, false})
	}
	names := func(ps []string) {
		for _, p := range ps {
			queue = append(queue, item{p, false})
		}
	}
	for ino := range inos {
		names(t.inos[ino])
	}
	seen := map[string]struct{}{}
	type entry struct {
		b, a         fileState
		had, present bool
	}
	got := map[string]entry{}
	for len(queue) > 0 {
		it := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		p := it.p
		if _, ok := seen[p]; ok || p == "" {
			continue
		}
		seen[p] = struct{}{}
		b, had := t.files[p]
		a, present := statBeneath(t.upper, p)
		got[p] = entry{b, a, had, present}
		sameDir := had && present && b.mode.IsDir() && a.mode.IsDir() && a.ino == b.ino && !dirty[p] && !it.force
		if had && b.mode.IsDir() && !sameDir {
			for name := range t.kids[p] {
				queue = append(queue, item{joinRel(p, name), true})
			}
		}
		if present && a.mode.IsDir() && !sameDir {
			for _, c := range listBeneath(t.upper, p) {
				queue = append(queue, item{c, true})
			}
		}
		if had && !b.mode.IsDir() {
			names(t.inos[b.ino])
		}
		if present && !a.mode.IsDir() && (a.nlink > 1 || (had && a.ino != b.ino)) {
			names(t.inos[a.ino])
		}
	}
	before, after := listing{files: map[string]fileState{}}, listing{files: map[string]fileState{}}
	for p, e := range got {
		if e.had {
			before.files[p] = e.b
		}
		if e.present {
			after.files[p] = e.a
		}
	}
	changes := diffListings(before, after)
	for p, e := range got {
		if e.present {
			t.put(p, e.a)
		} else {
			t.drop(p)
		}
	}
	return changes
}

// statBeneath is lstat of rel below root, through directory
// descriptors (openParentBeneath): false when it is not there.
func statBeneath(root, rel string) (fileState, bool) {
	dir, base, err := openParentBeneath(root, rel)
	if err != nil {
		return fileState{}, false
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return fileState{}, false
	}
	return stateOf(&st), true
}

// stateOf is what a listing keeps of st.
func stateOf(st *unix.Stat_t) fileState {
	mode := fileMode(st.Mode)
	return fileState{mode: mode, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino,
		nlink: uint64(st.Nlink), whiteout: mode&fs.ModeCharDevice != 0 && st.Rdev == 0}
}

// listBeneath returns the paths of directory rel's entries below root
// (none when it cannot be read).
func listBeneath(root, rel string) []string {
	dir, base, err := openParentBeneath(root, rel)
	if err != nil {
		return nil
	}
	fd, err := unix.Openat(dir, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unix.Close(dir)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var out []string
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			out = append(out, joinRel(rel, n))
		}
		if err != nil || len(names) == 0 {
			return out
		}
	}
}
