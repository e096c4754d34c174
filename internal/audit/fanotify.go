package audit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The change tracker: a fanotify group per filesystem holding sandboxes'
// writable layers (the data dir's, or each sandbox's own with
// loop-device disk quotas; trackers.go), with a filesystem mark on it,
// reporting
// each change as the handle of the directory it happened in and the
// entry's name (FAN_REPORT_DFID_NAME, Linux 5.9), or, for a change that
// names no entry (a hard link count), the handle of the object
// (FAN_REPORT_FID). A filesystem mark sees every write to that
// filesystem whatever mount it goes through: overlayfs writes its upper
// dir through a private clone of its mount, which a mount mark would
// not see. One reader demultiplexes the events to the tree (tree.go) of
// the upper dir holding the directory, found by opening the handle
// (open_by_handle_at, relative to that filesystem's upper dir) and
// reading its path once, then cached. Nothing is held open on a
// sandbox's filesystem (it must unmount at delete); a filesystem mark
// goes with its filesystem.
//
// A run's end waits for a barrier (a file created in the tracker's own
// directory, which has a mark of its own: the group's events queue in
// the order they happen, whatever their filesystem, so once its event
// is read, every event queued before it is too), takes the paths named since, and compares only those with the
// baseline. When events may have been lost (queue overflow, a handle
// that cannot be resolved, the upper dir itself moved), the run falls
// back to a full walk, compared with the baseline, and the baseline is
// rebuilt from it. Whether the kernel reports overlayfs's writes on the
// upper dir's filesystem at all (before Linux 6.6, overlayfs writes file
// data through a file whose path is the overlay's, so the event goes to
// the overlay's inode) is checked at start on a real overlay
// (probeOverlay); if not, there is no tracker and every run walks.

// trackMask is what the tracker asks to be told.
const trackMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE | unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF | unix.FAN_ONDIR

// Info record types (linux/fanotify.h).
const (
	infoFID      = 1
	infoDFIDName = 2
	infoDFID     = 3
)

// barrierSeq names barrier files.
var barrierSeq atomic.Uint64

// barrierTimeout bounds the wait for a barrier's event.
const barrierTimeout = 5 * time.Second

// maxNotOurs bounds the cache of directories outside every upper dir.
const maxNotOurs = 1 << 16

// tracker follows the upper dirs on one filesystem. Its methods are safe
// for concurrent use; begin and end of one upper dir are called in turn
// (the recorder orders a sandbox's runs).
type tracker struct {
	fd     int
	events *os.File // fd, read by the reader
	dir    string   // the tracker's own directory (barriers)
	log    *slog.Logger
	limit  int // entries of a baseline (scanLimits.Tracked)
	done   chan struct{}

	// readMu guards the group's reads and buf; fdClosed says fd is
	// closed (see readOnce).
	readMu   sync.Mutex
	buf      []byte
	fdClosed bool

	// mu guards the fields below.
	mu         sync.Mutex
	barrierKey string
	trees      map[string]*tree // by canonical upper dir
	// fs is the filesystem marked (with the first tree), dev its
	// device: one per group, as fsids need not be unique (loop-device
	// filesystems made from one image share theirs).
	fs      fsid
	dev     uint64
	marked  bool
	dirs    map[string]dirRef
	notOurs map[string]struct{}
	waiters map[string]chan struct{}
	// broken says the reader stopped: nothing is tracked any more.
	broken bool
	// stats
	tracked, walked uint64
}

// fsid identifies a filesystem in events (statfs's f_fsid).
type fsid [8]byte

func fsidOf(p string) (fsid, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return fsid{}, err
	}
	var id fsid
	binary.LittleEndian.PutUint32(id[0:], uint32(st.Fsid.Val[0]))
	binary.LittleEndian.PutUint32(id[4:], uint32(st.Fsid.Val[1]))
	return id, nil
}

// dirRef is where a directory handle was found.
type dirRef struct {
	t   *tree
	rel string
	gen uint64 // t.gen then
}

// newTracker starts a tracker for the filesystem of dir (created, the
// tracker's own), checking that it sees overlayfs's writes there.
func newTracker(dir string, limit int, log *slog.Logger) (*tracker, error) {
	t, err := startTracker(dir, limit, log)
	if err != nil {
		return nil, err
	}
	if err := t.probeOverlay(); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// startTracker starts a tracker for the filesystem of dir, unchecked.
func startTracker(dir string, limit int, log *slog.Logger) (*tracker, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_REPORT_DFID_NAME|unix.FAN_REPORT_FID,
		unix.O_RDONLY|unix.O_LARGEFILE|unix.O_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fanotify_init: %w", err)
	}
	t := &tracker{fd: fd, dir: dir, log: log, limit: limit, done: make(chan struct{}), buf: make([]byte, 256<<10),
		trees: map[string]*tree{}, dirs: map[string]dirRef{}, notOurs: map[string]struct{}{}, waiters: map[string]chan struct{}{}}
	fail := func(err error) (*tracker, error) {
		unix.Close(fd)
		return nil, err
	}
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, dir, 0)
	if err != nil {
		return fail(fmt.Errorf("name_to_handle_at %s: %w", dir, err))
	}
	id, err := fsidOf(dir)
	if err != nil {
		return fail(err)
	}
	t.barrierKey = handleKey(id, h.Type(), h.Bytes())
	// An inode mark: only the barriers' events, not the filesystem's.
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD, unix.FAN_CREATE, unix.AT_FDCWD, dir); err != nil {
		return fail(fmt.Errorf("fanotify_mark %s: %w", dir, err))
	}
	t.events = os.NewFile(uintptr(fd), "fanotify")
	go t.read(t.events)
	return t, nil
}

// close stops the reader. Idempotent.
func (t *tracker) close() {
	t.mu.Lock()
	f := t.events
	t.events = nil
	t.mu.Unlock()
	if f == nil {
		return
	}
	// No read of fd once this returns; not held across Close, which
	// waits for the reader's read in progress.
	t.readMu.Lock()
	t.fdClosed = true
	t.readMu.Unlock()
	f.Close()
	<-t.done
}

func handleKey(fs fsid, typ int32, b []byte) string {
	var k [4]byte
	binary.LittleEndian.PutUint32(k[:], uint32(typ))
	return string(fs[:]) + string(k[:]) + string(b)
}

// read is the reader: it decodes the events of f until it is closed.
func (t *tracker) read(f *os.File) {
	defer close(t.done)
	rc, err := f.SyscallConn()
	for err == nil {
		var rerr error
		err = rc.Read(func(uintptr) bool {
			rerr = t.readOnce()
			return !errors.Is(rerr, unix.EAGAIN) // else wait until readable
		})
		if err == nil && rerr != nil && !errors.Is(rerr, unix.EINTR) {
			err = rerr
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.events == nil {
		return // closed
	}
	t.log.Warn("audit: reading fanotify events; every run walks from now on", "err", err)
	t.broken = true
	t.lostAllLocked()
}

// readOnce reads and handles what events are queued, up to a buffer's
// worth (EAGAIN: none). The reader calls it when the group is readable,
// and a barrier right after making its event, so that the event, queued
// as it was made, is usually handled without waiting for the reader to
// be woken and scheduled. readMu keeps each read and its handling
// together, so events are handled in their order.
func (t *tracker) readOnce() error {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	if t.fdClosed {
		return os.ErrClosed
	}
	n, err := unix.Read(t.fd, t.buf)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.decodeLocked(t.buf[:n])
	t.mu.Unlock()
	return nil
}

// lostAllLocked marks every tree as having missed events and wakes the
// barriers' waiters (their events may be lost too).
func (t *tracker) lostAllLocked() {
	for _, tr := range t.trees {
		tr.lost = true
	}
	for k, ch := range t.waiters {
		close(ch)
		delete(t.waiters, k)
	}
}

// decodeLocked handles a buffer of events.
func (t *tracker) decodeLocked(b []byte) {
	for len(b) >= unix.FAN_EVENT_METADATA_LEN {
		evLen := int(binary.LittleEndian.Uint32(b[0:]))
		metaLen := int(binary.LittleEndian.Uint16(b[6:]))
		if evLen < metaLen || evLen > len(b) || metaLen < unix.FAN_EVENT_METADATA_LEN {
			t.log.Warn("audit: a malformed fanotify event; the next run of each sandbox walks its writable layer", "len", evLen)
			t.lostAllLocked()
			return
		}
		mask := binary.LittleEndian.Uint64(b[8:])
		// (No fd to close: a group reporting handles gets FAN_NOFD.)
		t.eventLocked(mask, b[metaLen:evLen])
		b = b[evLen:]
	}
}

// eventLocked handles one event with info records info.
func (t *tracker) eventLocked(mask uint64, info []byte) {
	if mask&unix.FAN_Q_OVERFLOW != 0 {
		t.log.Warn("audit: fanotify queue overflowed; the next run of each sandbox walks its writable layer")
		t.lostAllLocked()
		return
	}
	var dirKey, name, objKey string
	var dirH, objH unix.FileHandle
	var dirFS, objFS fsid
	haveDir, haveObj := false, false
	for len(info) >= 4 {
		typ := info[0]
		l := int(binary.LittleEndian.Uint16(info[2:]))
		if l < 4 || l > len(info) {
			t.log.Warn("audit: a malformed fanotify event; the next run of each sandbox walks its writable layer", "info_len", l)
			t.lostAllLocked()
			return
		}
		rec := info[:l]
		info = info[l:]
		// header (4), fsid (8), handle_bytes (4), handle_type (4), handle
		if len(rec) < 20 {
			continue
		}
		hb := int(binary.LittleEndian.Uint32(rec[12:]))
		ht := int32(binary.LittleEndian.Uint32(rec[16:]))
		if 20+hb > len(rec) {
			t.log.Warn("audit: a malformed fanotify event; the next run of each sandbox walks its writable layer", "handle_len", hb)
			t.lostAllLocked()
			return
		}
		h := rec[20 : 20+hb]
		var fs fsid
		copy(fs[:], rec[4:12])
		switch typ {
		case infoDFIDName, infoDFID:
			dirKey, dirH, dirFS, haveDir = handleKey(fs, ht, h), unix.NewFileHandle(ht, h), fs, true
			if typ == infoDFIDName {
				nm := rec[20+hb:]
				if i := indexByte(nm, 0); i >= 0 {
					nm = nm[:i]
				}
				name = string(nm)
			}
		case infoFID:
			objKey, objH, objFS, haveObj = handleKey(fs, ht, h), unix.NewFileHandle(ht, h), fs, true
		}
	}
	switch {
	case haveDir && dirKey == t.barrierKey:
		if ch, ok := t.waiters[name]; ok && mask&unix.FAN_CREATE != 0 {
			close(ch)
			delete(t.waiters, name)
		}
	case haveDir:
		ref, ok := t.resolveDirLocked(dirFS, dirKey, dirH)
		if !ok {
			return
		}
		tr := ref.t
		if name == "" || name == "." {
			if ref.rel == "" {
				if mask&(unix.FAN_DELETE_SELF|unix.FAN_MOVE_SELF) != 0 {
					t.log.Info("audit: a writable layer's upper dir itself was moved or deleted", "upper", tr.upper, "mask", mask)
					tr.lost = true
				}
				return
			}
			if _, ok := tr.dirty[ref.rel]; !ok {
				tr.dirty[ref.rel] = false
			}
			return
		}
		// An entry created, deleted or moved may be another object under
		// the same name, even with the same inode number.
		p := joinRel(ref.rel, name)
		tr.dirty[p] = tr.dirty[p] || mask&(unix.FAN_CREATE|unix.FAN_DELETE|unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO) != 0
		if mask&unix.FAN_ONDIR != 0 {
			if mask&(unix.FAN_MOVED_FROM|unix.FAN_MOVED_TO|unix.FAN_DELETE) != 0 {
				tr.gen++ // cached locations below it may be stale
			}
			if mask&(unix.FAN_MOVED_TO|unix.FAN_CREATE) != 0 {
				// A directory from outside (overlayfs's work dir) is now
				// in an upper dir.
				clear(t.notOurs)
			}
		}
	case haveObj:
		t.objectLocked(objFS, objKey, objH)
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// gone reports whether err, from resolving an event's handle, says its
// object has no name left to find. open_by_handle_at answers ESTALE for
// a deleted inode, and ENOMEM (passed through unchanged by the kernel's
// handle decoding, where every other failure becomes ESTALE) when it
// cannot connect the inode to a parent: an inode being unlinked or
// renamed away as it is resolved, on this or another tree's filesystem
// (seen for overlayfs work-dir temporaries). Either way the change
// that matters also produced a directory-entry event, naming its path,
// in the directory it left or entered.
func gone(err error) bool {
	return errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOMEM)
}

// resolveDirLocked finds the tree and path of directory handle h.
func (t *tracker) resolveDirLocked(fs fsid, key string, h unix.FileHandle) (dirRef, bool) {
	if ref, ok := t.dirs[key]; ok && ref.gen == ref.t.gen && t.trees[ref.t.upper] == ref.t {
		return ref, true
	}
	if _, ok := t.notOurs[key]; ok {
		return dirRef{}, false
	}
	p, _, err := t.pathOfLocked(fs, h)
	if err != nil {
		if !gone(err) {
			// Cannot tell whose it is: every tree may have missed it.
			t.log.Info("audit: resolving a directory of a fanotify event; the next runs walk", "err", err)
			t.lostAllLocked()
		}
		return dirRef{}, false // gone: so is everything in it
	}
	tr, rel, ok := t.treeOfLocked(p)
	if !ok {
		if len(t.notOurs) >= maxNotOurs {
			clear(t.notOurs)
		}
		t.notOurs[key] = struct{}{}
		return dirRef{}, false
	}
	ref := dirRef{t: tr, rel: rel, gen: tr.gen}
	t.dirs[key] = ref
	return ref, true
}

// objectLocked handles an event naming only an object (a non-directory
// whose link count changed): its inode is dirty in the tree holding a
// name of it.
func (t *tracker) objectLocked(fs fsid, key string, h unix.FileHandle) {
	_ = key
	p, st, err := t.pathOfLocked(fs, h)
	if err != nil {
		if !gone(err) {
			t.log.Info("audit: resolving the object of a fanotify event; the next runs walk", "err", err)
			t.lostAllLocked()
		}
		return
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if tr, rel, ok := t.treeOfLocked(p); ok && rel != "" {
			if _, ok := tr.dirty[rel]; !ok {
				tr.dirty[rel] = false
			}
		}
		return
	}
	if tr, _, ok := t.treeOfLocked(p); ok {
		tr.dirtyInos[st.Ino] = struct{}{}
		return
	}
	if st.Nlink > 1 {
		// Its other names may be in any upper dir.
		for _, tr := range t.trees {
			tr.dirtyInos[st.Ino] = struct{}{}
		}
	}
}

// pathOfLocked opens handle h of filesystem fs and returns its path
// and stat (ENOENT when it is unlinked or not on a marked filesystem).
func (t *tracker) pathOfLocked(fs fsid, h unix.FileHandle) (string, unix.Stat_t, error) {
	var st unix.Stat_t
	if !t.marked || fs != t.fs {
		return "", st, unix.ENOENT
	}
	mfd := -1
	for upper := range t.trees {
		fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		// Not a gone sandbox's path, now on another filesystem.
		var fst unix.Stat_t
		if unix.Fstat(fd, &fst) == nil && fst.Dev == t.dev {
			mfd = fd
			break
		}
		unix.Close(fd)
	}
	if mfd < 0 {
		return "", st, unix.ENOENT
	}
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_PATH|unix.O_CLOEXEC)
	unix.Close(mfd)
	if err != nil {
		return "", st, err
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return "", st, err
	}
	if st.Nlink == 0 {
		return "", st, unix.ENOENT
	}
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", st, err
	}
	return p, st, nil
}

// treeOfLocked finds the tree whose upper dir holds path p.
func (t *tracker) treeOfLocked(p string) (*tree, string, bool) {
	for upper, tr := range t.trees {
		if p == upper {
			return tr, "", true
		}
		if rel, ok := strings.CutPrefix(p, upper+"/"); ok {
			return tr, rel, true
		}
	}
	return nil, "", false
}

// barrier returns once every event queued before it was called has been
// handled.
func (t *tracker) barrier(ctx context.Context) error {
	t.mu.Lock()
	if t.events == nil || t.broken {
		t.mu.Unlock()
		return fmt.Errorf("change tracker closed: %w", errdefs.ErrUnavailable)
	}
	// Unique across groups: they share the directory.
	name := "b" + strconv.FormatUint(barrierSeq.Add(1), 10)
	ch := make(chan struct{})
	t.waiters[name] = ch
	t.mu.Unlock()
	forget := func() {
		t.mu.Lock()
		delete(t.waiters, name)
		t.mu.Unlock()
	}
	p := filepath.Join(t.dir, name)
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		forget()
		return fmt.Errorf("barrier: %w", err)
	}
	unix.Close(fd)
	go unix.Unlink(p) // off the run's path; the mark asks for creations only
	// Its event is queued: read it here rather than wait for the reader.
	for {
		select {
		case <-ch:
			return nil
		default:
		}
		if t.readOnce() != nil {
			break // none left (or closed): the reader has them
		}
	}
	timer := time.NewTimer(barrierTimeout)
	defer timer.Stop()
	select {
	case <-ch:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	forget()
	return fmt.Errorf("barrier: its event did not arrive: %w", errdefs.ErrUnavailable)
}

// treeFor returns the tree of upper, made on first use; nil when upper
// cannot be tracked (not on the tracker's mount, or too big).
func (t *tracker) treeFor(upper string) (*tree, string) {
	canon, err := filepath.EvalSymlinks(upper)
	if err != nil {
		return nil, ""
	}
	t.mu.Lock()
	tr, broken := t.trees[canon], t.broken
	t.mu.Unlock()
	if broken {
		return nil, canon
	}
	if tr != nil {
		if tr.tooBig {
			return nil, canon
		}
		return tr, canon
	}
	id, err := fsidOf(canon)
	if err != nil {
		return nil, canon
	}
	var st unix.Stat_t
	if err := unix.Stat(canon, &st); err != nil {
		return nil, canon
	}
	tr = newTree(canon)
	tr.fs = id
	tr.lost = true // no baseline yet
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.trees[canon]; old != nil {
		return old, canon
	}
	if t.marked && (t.dev != st.Dev || t.fs != id) {
		return nil, canon // another group's
	}
	// Marked again for each new tree: a device number is reused (a loop
	// device of a deleted sandbox's filesystem, made again from the same
	// image): the filesystem behind it may be another one, whose mark went
	// with the old one. Marking a marked filesystem changes nothing.
	if err := unix.FanotifyMark(t.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, trackMask, unix.AT_FDCWD, canon); err != nil {
		t.log.Info("audit: cannot follow a writable layer's filesystem; its runs walk it", "upper", canon, "err", err)
		return nil, canon
	}
	t.marked, t.fs, t.dev = true, id, st.Dev
	// Trees of gone sandboxes (their path gone, or on another filesystem).
	for u := range t.trees {
		var ust unix.Stat_t
		if unix.Stat(u, &ust) != nil || ust.Dev != t.dev {
			delete(t.trees, u)
		}
	}
	t.trees[canon] = tr
	// Its directories may have been seen before, as no one's.
	clear(t.notOurs)
	return tr, canon
}

// forget stops tracking upper (its sandbox is gone).
func (t *tracker) forget(upper string) {
	canon, err := filepath.EvalSymlinks(upper)
	if err != nil {
		canon = upper
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.trees[canon]
	if tr == nil {
		return
	}
	delete(t.trees, canon)
}

// idle reports whether t follows no tree.
func (t *tracker) idle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.trees) == 0
}

// take returns what the reader gathered for tr since the last take.
func (t *tracker) take(tr *tree) (dirty map[string]bool, inos map[uint64]struct{}, lost bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dirty, inos, lost = tr.dirty, tr.dirtyInos, tr.lost
	tr.dirty, tr.dirtyInos, tr.lost = map[string]bool{}, map[uint64]struct{}{}, false
	return dirty, inos, lost
}

// rootIno is the inode of upper (0: none).
func rootIno(upper string) uint64 {
	var st unix.Stat_t
	if unix.Lstat(upper, &st) != nil {
		return 0
	}
	return st.Ino
}

// begin prepares upper for a tracked run. With absorb, what changed
// since the last run is folded into the baseline unreported (it was done
// outside runs); without, it will be reported with this run's changes.
// An error means the run cannot be tracked: it walks.
func (t *tracker) begin(ctx context.Context, upper string, absorb bool) error {
	tr, _ := t.treeFor(upper)
	if tr == nil {
		return fmt.Errorf("%s is not tracked: %w", upper, errdefs.ErrUnavailable)
	}
	if !absorb && tr.built {
		return nil
	}
	if err := t.barrier(ctx); err != nil {
		return err
	}
	dirty, inos, lost := t.take(tr)
	if lost || !tr.built || rootIno(upper) != tr.rootIno {
		return t.rebuild(tr, upper)
	}
	tr.collect(dirty, inos)
	return nil
}

// rebuild lists upper in full as tr's baseline.
func (t *tracker) rebuild(tr *tree, upper string) error {
	ino := rootIno(upper)
	l := scanUpper(upper, t.limit)
	if l.truncated {
		t.mu.Lock()
		tr.tooBig = true
		t.mu.Unlock()
		t.log.Info("audit: writable layer too big to track; its runs walk it", "upper", upper, "entries", t.limit)
		return fmt.Errorf("%s has more than %d entries: %w", upper, t.limit, errdefs.ErrUnavailable)
	}
	tr.setBaseline(l)
	tr.rootIno = ino
	return nil
}

// end returns the changes to upper since begin (and, when begin did not
// absorb, since the last run), folding them into the baseline. When
// events may have been lost it walks upper and compares with the
// baseline (walked says so). An error means upper is not tracked.
func (t *tracker) end(ctx context.Context, upper string) (changes []fileChange, walked bool, err error) {
	tr, _ := t.treeFor(upper)
	if tr == nil || !tr.built {
		return nil, false, fmt.Errorf("%s is not tracked: %w", upper, errdefs.ErrUnavailable)
	}
	berr := t.barrier(ctx)
	dirty, inos, lost := t.take(tr)
	if berr == nil && !lost && rootIno(upper) == tr.rootIno {
		start := time.Now()
		changes = tr.collect(dirty, inos)
		t.mu.Lock()
		t.tracked++
		t.mu.Unlock()
		t.log.DebugContext(ctx, "audit: tracked run", "upper", upper, "paths", len(dirty), "inodes", len(inos), "changes", len(changes), "took", time.Since(start))
		return changes, false, nil
	}
	t.log.Info("audit: change tracker may have missed events; walking the writable layer", "upper", upper, "barrier_err", berr, "lost", lost)
	before := tr.listing()
	if err := t.rebuild(tr, upper); err != nil {
		return nil, true, err
	}
	t.mu.Lock()
	t.walked++
	t.mu.Unlock()
	return diffListings(before, tr.listing()), true, nil
}
