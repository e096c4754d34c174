package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// account is a resolved user.
type account struct {
	name   string // empty for a uid without a passwd entry
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups
	home   string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// readColonFile returns the colon-separated records of an /etc file with
// at least n fields. A missing file has no records. The records are
// cached (etcFiles): callers must not modify them.
func readColonFile(path string, n int) ([][]string, error) {
	return etcFiles.read(path, n)
}

// etcFiles caches the parsed passwd and group files: every exec resolves
// its user with them, and a stat of each is much cheaper than reading and
// parsing them.
var etcFiles = etcCache{entries: map[etcKey]etcEntry{}}

// etcCache maps a file and field count to its records, valid while the
// file's identity (device, inode, size, change and modification times) is
// unchanged. A file changed within racyWindow of being read is not cached:
// filesystem timestamps are coarse (a tick), so two writes of the same
// size in one tick would otherwise look like one.
type etcCache struct {
	// mu guards entries.
	mu      sync.Mutex
	entries map[etcKey]etcEntry
}

type etcKey struct {
	path string
	n    int
}

type etcEntry struct {
	id   fileID
	recs [][]string
}

type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

const racyWindow = time.Second

func (c *etcCache) read(path string, n int) ([][]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	id := fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	key := etcKey{path, n}
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && e.id == id {
		return e.recs, nil
	}
	recs, err := parseColonFile(path, n)
	if err != nil {
		return nil, err
	}
	changed := time.Unix(st.Ctim.Unix())
	if m := time.Unix(st.Mtim.Unix()); m.After(changed) {
		changed = m
	}
	c.mu.Lock()
	if time.Since(changed) > racyWindow {
		c.entries[key] = etcEntry{id: id, recs: recs}
	} else {
		delete(c.entries, key)
	}
	c.mu.Unlock()
	return recs, nil
}

// parseColonFile reads and parses path (see readColonFile).
func parseColonFile(path string, n int) ([][]string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) >= n {
			out = append(out, fields)
		}
	}
	return out, sc.Err()
}

func readPasswd(etc string) ([]passwdEntry, error) {
	recs, err := readColonFile(filepath.Join(etc, "passwd"), 7)
	if err != nil {
		return nil, err
	}
	var out []passwdEntry
	for _, r := range recs {
		uid, err1 := strconv.ParseUint(r[2], 10, 32)
		gid, err2 := strconv.ParseUint(r[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, passwdEntry{name: r[0], uid: uint32(uid), gid: uint32(gid), home: r[5]})
	}
	return out, nil
}

func readGroup(etc string) ([]groupEntry, error) {
	recs, err := readColonFile(filepath.Join(etc, "group"), 4)
	if err != nil {
		return nil, err
	}
	var out []groupEntry
	for _, r := range recs {
		gid, err := strconv.ParseUint(r[2], 10, 32)
		if err != nil {
			continue
		}
		g := groupEntry{name: r[0], gid: uint32(gid)}
		if r[3] != "" {
			g.members = strings.Split(r[3], ",")
		}
		out = append(out, g)
	}
	return out, nil
}

// lookupAccount resolves spec — "", "name", "uid", "name:group" or
// "uid:gid" (groups by name or number) — with the passwd and group files in
// etc. An empty spec is the guest's own uid.
func lookupAccount(etc, spec string) (account, error) {
	users, err := readPasswd(etc)
	if err != nil {
		return account{}, fmt.Errorf("reading passwd: %w", err)
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if spec == "" {
		userPart = strconv.Itoa(os.Getuid())
	}
	if userPart == "" || (hasGroup && groupPart == "") {
		return account{}, fmt.Errorf("invalid user %q: %w", spec, errdefs.ErrInvalidArgument)
	}
	acct := account{home: "/"}
	var pw *passwdEntry
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		acct.uid = uint32(n)
		for i := range users {
			if users[i].uid == acct.uid {
				pw = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].name == userPart {
				pw = &users[i]
				break
			}
		}
		if pw == nil {
			return account{}, fmt.Errorf("user %q not found in /etc/passwd: %w", userPart, errdefs.ErrInvalidArgument)
		}
		acct.uid = pw.uid
	}
	if pw != nil {
		acct.name, acct.gid = pw.name, pw.gid
		if pw.home != "" {
			acct.home = pw.home
		}
	}
	groups, err := readGroup(etc)
	if err != nil {
		return account{}, fmt.Errorf("reading group: %w", err)
	}
	if hasGroup {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			acct.gid = uint32(n)
		} else {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					acct.gid, found = g.gid, true
					break
				}
			}
			if !found {
				return account{}, fmt.Errorf("group %q not found in /etc/group: %w", groupPart, errdefs.ErrInvalidArgument)
			}
		}
	}
	acct.groups = []uint32{}
	if acct.name != "" {
		for _, g := range groups {
			for _, m := range g.members {
				if m == acct.name && g.gid != acct.gid {
					acct.groups = append(acct.groups, g.gid)
					break
				}
			}
		}
	}
	return acct, nil
}
