package native

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/native/forker"
)

// The sandbox's filesystem is built here, on the host, as detached mounts
// (fsopen/fsmount, open_tree): nothing is attached to the host's mount
// table, and the guest, which runs as an unprivileged host uid that cannot
// traverse the data dir (0700), never resolves a host path. It receives
// the two mount descriptors on its config socket and attaches them in its
// own mount namespace (package nsinit); once the guest and the daemon have
// closed them, the mounts live only as long as the sandbox's namespace.
//
// Layers, UpperDir and WorkDir are owned on disk by spec.LayerIDs (the
// canonical range). When the sandbox's own range (spec.UIDMap) differs,
// they are shown to it through idmapped mounts (MOUNT_ATTR_IDMAP with a
// user namespace mapping LayerIDs onto UIDMap): a file owned by
// LayerIDs.HostID+n on disk appears owned by UIDMap.HostID+n, and a file the
// sandbox creates as UIDMap.HostID+n is stored as LayerIDs.HostID+n. No
// file on disk is ever owned by a sandbox's host ids, so a process escaping
// a sandbox owns none of any sandbox's files, its own included.

// guestMounts are the detached mounts handed to a guest (nsinit.ConfigFDs
// order).
type guestMounts [2]int

func (m guestMounts) close() {
	for _, fd := range m {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// mountError is a failed mount syscall of the host side.
type mountError struct {
	op, path string
	err      error
}

func (e *mountError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *mountError) Unwrap() error { return e.err }

// buildMounts builds spec's root filesystem (a detached overlay mount of
// its layers, upper and work dirs) and a detached read-only, nosuid, nodev
// bind mount of its runner dir. The overlay is made with the credentials
// of the sandbox's root (fsuid UIDMap.HostID, all capabilities of this
// process) on a thread of its own, discarded afterwards: overlayfs makes
// its work dir and later copy-ups with the creator's credentials, and
// through an idmapped upper only ids of the sandbox's range can be stored.
func (b *Backend) buildMounts(spec runtime.Spec) (guestMounts, error) {
	userns := -1
	if ids := layerIDs(spec); ids != spec.UIDMap || ids != spec.GIDMap {
		var err error
		if userns, err = b.idmaps.get(filepath.Join(spec.RunnerDir, "agentbox"), ids, spec.UIDMap, spec.GIDMap); err != nil {
			return guestMounts{-1, -1}, err
		}
	}
	type result struct {
		m   guestMounts
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Never unlocked: the thread's credentials are changed, so it
		// ends with this goroutine.
		goruntime.LockOSThread()
		m, err := buildMountsLocked(spec, userns)
		res <- result{m, err}
	}()
	r := <-res
	return r.m, r.err
}

// layerIDs is the range spec's layers are owned by on disk.
func layerIDs(spec runtime.Spec) runtime.IDMap {
	if spec.LayerIDs.Size == 0 {
		return spec.UIDMap
	}
	return spec.LayerIDs
}

func buildMountsLocked(spec runtime.Spec, userns int) (_ guestMounts, retErr error) {
	m := guestMounts{-1, -1}
	defer func() {
		if retErr != nil {
			m.close()
		}
	}()
	if err := becomeCreator(spec.UIDMap.HostID, spec.GIDMap.HostID); err != nil {
		return m, err
	}
	var err error
	if m[0], err = overlayMount(spec, userns); err != nil {
		return m, err
	}
	if m[1], err = cloneMount(spec.RunnerDir, -1, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		return m, err
	}
	return m, nil
}

// becomeCreator sets this (locked) thread's filesystem ids to the sandbox's
// root and keeps its effective capabilities (a change of fsuid away from
// 0 drops the filesystem ones).
func becomeCreator(uid, gid uint32) error {
	_ = unix.Setfsgid(int(gid))
	_ = unix.Setfsuid(int(uid))
	if got, _ := unix.SetfsuidRetUid(-1); got != int(uid) {
		return &mountError{op: "setfsuid", path: fmt.Sprint(uid), err: unix.EPERM}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return &mountError{op: "capget", path: "self", err: err}
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return &mountError{op: "capset", path: "self", err: err}
	}
	return nil
}

// cloneMount returns a detached copy of the mount at path (not recursive)
// with attrs set, idmapped through userns when userns >= 0.
func cloneMount(path string, userns int, attrs uint64) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, &mountError{op: "open_tree", path: path, err: err}
	}
	if err := setAttrs(fd, path, userns, attrs); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// setAttrs sets attrs, and the idmap of userns when userns >= 0, on the
// detached mount fd.
func setAttrs(fd int, path string, userns int, attrs uint64) error {
	attr := unix.MountAttr{Attr_set: attrs}
	if userns >= 0 {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(userns)
	}
	if attr.Attr_set != 0 {
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return &mountError{op: "mount_setattr", path: path, err: err}
		}
	}
	return nil
}

// overlayMount makes the detached overlay of spec. Without an idmap the
// layers are passed by path; with one, each layer, and the directory
// holding upper and work, is an idmapped clone passed by descriptor.
func overlayMount(spec runtime.Spec, userns int) (int, error) {
	if !overlayTakesFds() {
		return overlayMountStaged(spec, userns)
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, &mountError{op: "fsopen", path: "overlay", err: err}
	}
	defer unix.Close(fsfd)
	setPath := func(key, val string) error {
		if err := unix.FsconfigSetString(fsfd, key, val); err != nil {
			return &mountError{op: "fsconfig " + key, path: val, err: err}
		}
		return nil
	}
	setFd := func(key, name string, fd int) error {
		if err := unix.FsconfigSetFd(fsfd, key, fd); err != nil {
			return &mountError{op: "fsconfig " + key, path: name, err: err}
		}
		return nil
	}
	if userns < 0 {
		for _, l := range spec.Layers {
			if err := setPath("lowerdir+", l); err != nil {
				return -1, err
			}
		}
		if err := setPath("upperdir", spec.UpperDir); err != nil {
			return -1, err
		}
		if err := setPath("workdir", spec.WorkDir); err != nil {
			return -1, err
		}
	} else {
		// Each clone stays open until the overlay is made: closing the
		// last descriptor of a detached mount unmounts it, and overlayfs
		// clones its layers only at create.
		for _, l := range spec.Layers {
			fd, err := cloneMount(l, userns, 0)
			if err != nil {
				return -1, err
			}
			defer unix.Close(fd)
			if err := setFd("lowerdir+", l, fd); err != nil {
				return -1, err
			}
		}
		// Upper and work must be on one mount: a clone of their
		// directory (owned by host root, which the idmap does not map),
		// opened into before the idmap is set.
		dir := filepath.Dir(spec.UpperDir)
		if filepath.Dir(spec.WorkDir) != dir {
			return -1, fmt.Errorf("upper %s and work %s must share a directory: %w", spec.UpperDir, spec.WorkDir, errdefs.ErrInvalidArgument)
		}
		dfd, fds, err := upperWorkClone(spec, dir, userns)
		if err != nil {
			return -1, err
		}
		defer closeAll(dfd, fds[0], fds[1])
		if err := setFd("upperdir", spec.UpperDir, fds[0]); err != nil {
			return -1, err
		}
		if err := setFd("workdir", spec.WorkDir, fds[1]); err != nil {
			return -1, err
		}
	}
	if err := unix.FsconfigSetFlag(fsfd, "userxattr"); err != nil {
		return -1, &mountError{op: "fsconfig userxattr", path: "overlay", err: err}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, &mountError{op: "fsconfig create", path: spec.UpperDir, err: err}
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, &mountError{op: "fsmount", path: spec.UpperDir, err: err}
	}
	return mfd, nil
}

// idmapCache holds, per pair of (layer range, sandbox range), a user
// namespace whose maps send the first onto the second: the idmap of that
// sandbox's mounts. Made once (a short-lived helper process holds the
// namespace while it is opened) and kept until close; a miss makes the
// next two ranges up in the background too (ranges are handed out lowest
// first, so they are the likely next ones), keeping the helper's start
// off most creates. Safe for concurrent use.
type idmapCache struct {
	forker *guestForker // nil: helpers are forked by this process

	// mu guards the fields below.
	mu      sync.Mutex
	entries map[[3]runtime.IDMap]*idmapEntry
}

// idmapEntry is one namespace, made once; done is closed when fd and err
// are set.
type idmapEntry struct {
	done chan struct{}
	fd   int
	err  error
}

// get returns the namespace mapping from onto uids and gids, made with the
// runner binary runner ("agentbox guest hold") on first use.
func (c *idmapCache) get(runner string, from, uids, gids runtime.IDMap) (int, error) {
	if from.Size != uids.Size || from.Size != gids.Size {
		return -1, fmt.Errorf("idmap %+v onto %+v/%+v: sizes differ: %w", from, uids, gids, errdefs.ErrInvalidArgument)
	}
	e, made := c.entry(runner, from, uids, gids)
	<-e.done
	if made && e.err == nil && uids == gids {
		for i := uint32(1); i <= 2; i++ {
			next := runtime.IDMap{HostID: uids.HostID + i*uids.Size, Size: uids.Size}
			if next.HostID > uids.HostID {
				go c.entry(runner, from, next, next)
			}
		}
	}
	return e.fd, e.err
}

// entry returns the cache entry of the key, starting to make it (made
// true) unless it exists. A failed entry is dropped so a later get tries
// again.
func (c *idmapCache) entry(runner string, from, uids, gids runtime.IDMap) (_ *idmapEntry, made bool) {
	key := [3]runtime.IDMap{from, uids, gids}
	c.mu.Lock()
	if e, ok := c.entries[key]; ok {
		c.mu.Unlock()
		return e, false
	}
	if c.entries == nil {
		c.entries = map[[3]runtime.IDMap]*idmapEntry{}
	}
	e := &idmapEntry{done: make(chan struct{}), fd: -1}
	c.entries[key] = e
	c.mu.Unlock()
	e.fd, e.err = c.make(runner, from, uids, gids)
	if e.err != nil {
		c.mu.Lock()
		delete(c.entries, key)
		c.mu.Unlock()
	}
	close(e.done)
	return e, true
}

// make starts "agentbox guest hold" in a new user namespace with the maps,
// opens the namespace and lets the helper exit (it waits for its stdin to
// close).
func (c *idmapCache) make(runner string, from, uids, gids runtime.IDMap) (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer w.Close()
	defer r.Close()
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return -1, err
	}
	defer devnull.Close()
	req := forker.Request{
		Path:        runner,
		Args:        append([]string{"agentbox"}, HoldArgs...),
		Env:         []string{guestPath, guestProcs},
		Dir:         "/",
		Cloneflags:  unix.CLONE_NEWUSER,
		UIDMappings: []syscall.SysProcIDMap{{ContainerID: int(from.HostID), HostID: int(uids.HostID), Size: int(from.Size)}},
		GIDMappings: []syscall.SysProcIDMap{{ContainerID: int(from.HostID), HostID: int(gids.HostID), Size: int(from.Size)}},
	}
	var (
		pid  int
		wait func()
	)
	if c.forker != nil {
		// Stopped right after its exec (no Go runtime start, which was
		// most of its cost); killed once its namespace is open. Were it
		// ever let go, it waits for its stdin to close.
		req.Ptrace = true
		var pidfd int
		if pid, pidfd, err = c.forker.spawn(req, []int{int(r.Fd()), int(devnull.Fd()), int(devnull.Fd())}); err != nil {
			return -1, fmt.Errorf("idmap helper: %w", err)
		}
		wait = func() { // the forker reaps it
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
			_ = unix.Close(pidfd)
		}
	} else {
		pa := &os.ProcAttr{Dir: "/", Env: req.Env, Files: []*os.File{r, devnull, devnull}, Sys: req.SysProcAttr(-1)}
		p, err := os.StartProcess(req.Path, req.Args, pa)
		if err != nil {
			return -1, fmt.Errorf("idmap helper: %w", err)
		}
		pid = p.Pid
		wait = func() { _, _ = p.Wait() }
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	w.Close()
	wait()
	if err != nil {
		return -1, &mountError{op: "open", path: "user namespace of the idmap helper", err: err}
	}
	return fd, nil
}

// close closes every namespace descriptor made so far; the cache stays
// usable.
func (c *idmapCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.entries {
		select {
		case <-e.done:
			if e.fd >= 0 {
				_ = unix.Close(e.fd)
			}
			delete(c.entries, k)
		default: // being made; its descriptor stays open
		}
	}
}

// forceStagedOverlay makes overlayMount stage its layers even where the
// kernel takes them by descriptor (tests of the older kernels' path).
var forceStagedOverlay bool

var (
	overlayFdsOnce sync.Once
	overlayFds     bool
)

// overlayTakesFds reports whether the kernel's overlayfs takes its layers
// one by one through fsconfig ("lowerdir+", and layers by descriptor:
// Linux 6.8). Older kernels (Debian 12's 6.1) know only "lowerdir", a
// string fsconfig bounds to 256 bytes, and resolve layers only in the
// mounter's own mount namespace.
func overlayTakesFds() bool {
	if forceStagedOverlay {
		return false
	}
	overlayFdsOnce.Do(func() {
		// Asked with a descriptor, as overlayMount passes layers: before
		// 6.5 overlayfs takes any key as a string and fails only at
		// create; 6.5-6.7 refuse "lowerdir+"; 6.8 takes it.
		fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return
		}
		defer unix.Close(fsfd)
		root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(root)
		overlayFds = unix.FsconfigSetFd(fsfd, "lowerdir+", root) == nil
	})
	return overlayFds
}

// overlayMountStaged is overlayMount for kernels whose overlayfs takes no
// layer by descriptor: on this (locked, discarded) thread, in a private
// mount namespace of its own that nothing propagates into or out of, the
// idmapped clones of the layers and of the upper/work directory are
// attached under a tmpfs at spec.StateDir, the overlay is mounted there
// with mount(2) (options up to a page, short staged paths), and a
// detached clone of it is returned. The staged mounts die with the
// thread's namespace; the overlay keeps private clones of its layers.
func overlayMountStaged(spec runtime.Spec, userns int) (int, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return -1, &mountError{op: "unshare", path: "mount namespace", err: err}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, &mountError{op: "make private", path: "/", err: err}
	}
	stage := spec.StateDir
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0777,size=64k"); err != nil {
		return -1, &mountError{op: "mount tmpfs", path: stage, err: err}
	}
	attach := func(fd int, name string) (string, error) {
		dst := filepath.Join(stage, name)
		if err := os.Mkdir(dst, 0o700); err != nil {
			return "", &mountError{op: "mkdir", path: dst, err: err}
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", &mountError{op: "move_mount", path: dst, err: err}
		}
		return dst, nil
	}
	lowers := make([]string, 0, len(spec.Layers))
	upper, work := spec.UpperDir, spec.WorkDir
	if userns < 0 {
		lowers = append(lowers, spec.Layers...)
	} else {
		for i, l := range spec.Layers {
			fd, err := cloneMount(l, userns, 0)
			if err != nil {
				return -1, err
			}
			dst, err := attach(fd, fmt.Sprintf("l%d", i))
			unix.Close(fd)
			if err != nil {
				return -1, err
			}
			lowers = append(lowers, dst)
		}
		// Upper and work share one idmapped clone of their directory,
		// which is owned by host root: the idmap does not map it, so no
		// path through the clone's root resolves for the sandbox's root.
		// Both are opened in the clone before the idmap is set, and named
		// to mount(2) by their descriptors.
		dir := filepath.Dir(spec.UpperDir)
		if filepath.Dir(spec.WorkDir) != dir {
			return -1, fmt.Errorf("upper %s and work %s must share a directory: %w", spec.UpperDir, spec.WorkDir, errdefs.ErrInvalidArgument)
		}
		dfd, fds, err := upperWorkClone(spec, dir, userns)
		if err != nil {
			return -1, err
		}
		defer closeAll(dfd, fds[0], fds[1])
		if _, err := attach(dfd, "u"); err != nil {
			return -1, err
		}
		upper, work = fmt.Sprintf("/proc/self/fd/%d", fds[0]), fmt.Sprintf("/proc/self/fd/%d", fds[1])
	}
	target := filepath.Join(stage, "root")
	if err := os.Mkdir(target, 0o700); err != nil {
		return -1, &mountError{op: "mkdir", path: target, err: err}
	}
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work + ",userxattr"
	if len(opts) >= os.Getpagesize() {
		return -1, fmt.Errorf("overlay options of %d layers exceed a page: %w", len(lowers), errdefs.ErrInvalidArgument)
	}
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return -1, &mountError{op: "mount overlay", path: spec.UpperDir, err: err}
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, target, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, &mountError{op: "open_tree", path: target, err: err}
	}
	return fd, nil
}

// upperWorkClone returns a detached clone of dir (the directory holding
// spec's upper and work dirs, which must be on one mount for overlayfs)
// and O_PATH descriptors of upper and work inside it, opened before the
// clone is idmapped through userns and made nosuid,nodev: dir is owned by
// host root, which the idmap does not map, so no path through the
// clone's root resolves for the sandbox's root afterwards. The caller
// closes all three.
func upperWorkClone(spec runtime.Spec, dir string, userns int) (int, [2]int, error) {
	fds := [2]int{-1, -1}
	dfd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fds, &mountError{op: "open_tree", path: dir, err: err}
	}
	for i, p := range []string{spec.UpperDir, spec.WorkDir} {
		fd, err := unix.Openat2(dfd, filepath.Base(p), &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			closeAll(dfd, fds[0], fds[1])
			return -1, [2]int{-1, -1}, &mountError{op: "openat2", path: p, err: err}
		}
		fds[i] = fd
	}
	if err := setAttrs(dfd, dir, userns, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		closeAll(dfd, fds[0], fds[1])
		return -1, [2]int{-1, -1}, err
	}
	return dfd, fds, nil
}

// closeAll closes the descriptors that are not negative.
func closeAll(fds ...int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
