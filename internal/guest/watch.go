package guest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// maxWatches bounds the directories one watch operation watches.
const maxWatches = 8192

// watchMask is what a watch asks inotify for.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_DELETE_SELF |
	unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB

// watcher is one watch operation's inotify instance.
type watcher struct {
	f         *os.File
	fd        int
	root      string
	recursive bool
	dirs      map[int32]string // watch descriptor → directory
}

// watch serves proto.OpWatch: inotify on the directory (and, recursive,
// its subdirectories, including those made later) until the client
// closes the connection.
func (s *server) watch(c *conn, req *proto.Request) error {
	root, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("watching %s: %w", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", root, errdefs.ErrInvalidArgument)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("watching %s: inotify: %w", root, err)
	}
	// Non-blocking: reads go through the runtime's poller, so Close
	// wakes a pending Read.
	w := &watcher{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, root: root, recursive: req.Recursive, dirs: map[int32]string{}}
	defer w.f.Close()
	if err := w.add(root); err != nil {
		return err
	}
	if req.Recursive {
		if err := w.addTree(root); err != nil {
			return err
		}
	}
	if err := c.reply(nil); err != nil {
		return err
	}
	// The client ends the watch by closing the connection.
	go func() {
		_, _ = io.Copy(io.Discard, c.br)
		_ = w.f.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return nil // closed: the client went away
		}
		evs, err := w.parse(buf[:n])
		for _, ev := range evs {
			if werr := proto.WriteJSONFrame(c.bw, proto.FrameResult, ev); werr != nil {
				return werr
			}
		}
		if ferr := c.bw.Flush(); ferr != nil {
			return ferr
		}
		if err != nil {
			return err
		}
	}
}

// add watches one directory.
func (w *watcher) add(dir string) error {
	if len(w.dirs) >= maxWatches {
		return fmt.Errorf("watching %s: more than %d directories: %w", w.root, maxWatches, errdefs.ErrResourceExhausted)
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	if err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	w.dirs[int32(wd)] = dir
	return nil
}

// addTree watches every directory below dir (symlinks not followed).
func (w *watcher) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // gone meanwhile, or unreadable: not watched
		}
		if p == dir || !d.IsDir() {
			return nil
		}
		if err := w.add(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		return nil
	})
}

// parse decodes a read of inotify events into FSEvents, watching new
// directories of a recursive watch as they appear. An error (events lost)
// comes with the events decoded before it.
func (w *watcher) parse(b []byte) ([]api.FSEvent, error) {
	var out []api.FSEvent
	for len(b) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		mask, wd := raw.Mask, raw.Wd
		b = b[end:]
		if mask&unix.IN_Q_OVERFLOW != 0 {
			return out, fmt.Errorf("watching %s: the kernel's event queue overflowed, events were lost: %w", w.root, errdefs.ErrResourceExhausted)
		}
		dir, ok := w.dirs[wd]
		if mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, wd)
			continue
		}
		if !ok {
			continue
		}
		full := dir
		if name != "" {
			full = filepath.Join(dir, name)
		} else if dir != w.root {
			continue // a subdirectory's own delete/move: its parent reports it
		}
		typ := eventType(mask)
		if typ == "" {
			continue
		}
		out = append(out, w.event(typ, full))
		if typ == api.FSEventCreate && mask&unix.IN_ISDIR != 0 && w.recursive {
			// What was made in the new directory before it was watched
			// is reported as created.
			if err := w.add(full); err == nil {
				made, err := w.addNew(full)
				out = append(out, made...)
				if err != nil {
					return out, err
				}
			} else if !errors.Is(err, unix.ENOENT) {
				return out, err
			}
		}
	}
	return out, nil
}

// event is an FSEvent of full, named relative to the watched directory.
func (w *watcher) event(typ, full string) api.FSEvent {
	rel, err := filepath.Rel(w.root, full)
	if err != nil {
		rel = full
	}
	return api.FSEvent{Type: typ, Path: full, Name: rel}
}

// addNew watches the directories below dir, a directory new to the
// watch, and returns a create event for every entry found in it.
func (w *watcher) addNew(dir string) ([]api.FSEvent, error) {
	var out []api.FSEvent
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		out = append(out, w.event(api.FSEventCreate, p))
		if d.IsDir() {
			if err := w.add(p); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		return nil
	})
	return out, err
}

// eventType maps an inotify mask to an FSEvent type ("" for none).
func eventType(mask uint32) string {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return api.FSEventCreate
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return api.FSEventRemove
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		return api.FSEventRename
	case mask&unix.IN_MODIFY != 0:
		return api.FSEventWrite
	case mask&unix.IN_ATTRIB != 0:
		return api.FSEventChmod
	}
	return ""
}
