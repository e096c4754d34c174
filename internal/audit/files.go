package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Files changed by a run are computed on the host from the sandbox's
// writable layer (its overlay upper directory): it is walked before the
// run and after it, and the two listings compared. Nothing the guest
// says is used. The cost is bounded: only the upper directory is walked
// (what the sandbox changed since its template), at most scanLimits.Entries
// entries; only changed regular files are hashed, each up to
// scanLimits.HashFile bytes and per run up to scanLimits.HashRun bytes.

// scanLimits bound the work of one run's file diff.
type scanLimits struct {
	Entries   int   // entries walked per listing
	Tracked   int   // entries of a layer the change tracker follows
	TrackFrom int   // Config.TrackFrom
	Events    int   // file events per run
	HashFile  int64 // bytes hashed per file
	HashRun   int64 // bytes hashed per run
}

var defaultScanLimits = scanLimits{Entries: 20_000, Tracked: 2_000_000, Events: 1000, HashFile: 16 << 20, HashRun: 128 << 20}

// fileState is what a listing keeps of one entry.
type fileState struct {
	mode     fs.FileMode
	size     int64
	mtime    int64
	ctime    int64
	ino      uint64
	nlink    uint64
	whiteout bool // an overlay whiteout: the path was deleted
}

// listing is the state of an upper directory at one time.
type listing struct {
	files map[string]fileState // by path relative to the upper dir
	// truncated says the walk stopped at scanLimits.Entries.
	truncated bool
}

// scanUpper lists upper (a missing directory lists empty). It walks with
// directory file descriptors (openat, fstatat), never following a link
// and never resolving a path from the root again.
func scanUpper(upper string, max int) listing {
	l := listing{files: map[string]fileState{}}
	if upper == "" {
		return l
	}
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return l
	}
	l.walk(fd, "", max)
	return l
}

// walk lists the directory open as fd (closed here), whose path relative
// to the upper dir is rel ("" for the top).
func (l *listing) walk(fd int, rel string, max int) {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, name := range names {
			if len(l.files) >= max {
				l.truncated = true
				return
			}
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			p := name
			if rel != "" {
				p = rel + "/" + name
			}
			fst := stateOf(&st)
			l.files[p] = fst
			if fst.mode.IsDir() {
				if sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
					l.walk(sub, p, max)
					if l.truncated {
						return
					}
				}
			}
		}
		if err != nil || len(names) == 0 {
			return
		}
	}
}

// fileMode converts a stat mode to an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// fileChange is one path that differs between two listings.
type fileChange struct {
	rel    string
	change string // api.FileCreated, FileModified, FileDeleted
	st     fileState
}

// diffListings compares before and after, sorted by path. Directories
// count when created or deleted, not when their entries change.
func diffListings(before, after listing) []fileChange {
	var out []fileChange
	for rel, a := range after.files {
		b, had := before.files[rel]
		switch {
		case a.whiteout && (!had || !b.whiteout):
			out = append(out, fileChange{rel, api.FileDeleted, a})
		case a.whiteout:
		case !had || b.whiteout:
			out = append(out, fileChange{rel, api.FileCreated, a})
		case a.mode.IsDir() && b.mode.IsDir():
		case a.mode != b.mode || a.size != b.size || a.mtime != b.mtime || a.ctime != b.ctime || a.ino != b.ino:
			out = append(out, fileChange{rel, api.FileModified, a})
		}
	}
	for rel, b := range before.files {
		if _, ok := after.files[rel]; !ok && !b.whiteout {
			out = append(out, fileChange{rel, api.FileDeleted, b})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out
}

// resolveCopyUps corrects changes for overlayfs copy-up: an entry new in
// the upper dir that the lower layers already had was not created by the
// run: a file (or link) was modified, a directory only got a new entry
// (dropped, like every directory change).
func resolveCopyUps(changes []fileChange, lowers []string) []fileChange {
	out := changes[:0]
	for _, c := range changes {
		if c.change == api.FileCreated && inLowers(lowers, c.rel) {
			if c.st.mode.IsDir() {
				continue
			}
			c.change = api.FileModified
		}
		out = append(out, c)
	}
	return out
}

// inLowers reports whether any of the lower layers has rel (not as a
// whiteout).
func inLowers(lowers []string, rel string) bool {
	for _, l := range lowers {
		fi, err := os.Lstat(filepath.Join(l, filepath.FromSlash(rel)))
		if err != nil {
			continue
		}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode()&fs.ModeCharDevice != 0 && sys.Rdev == 0 {
			return false
		}
		return true
	}
	return false
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	default:
		return "other"
	}
}

// fileEvent describes c, hashing a created or modified regular file
// within *budget bytes (decreased).
func fileEvent(upper string, c fileChange, lim scanLimits, budget *int64) api.FileEvent {
	ev := api.FileEvent{Path: "/" + c.rel, Change: c.change}
	if c.change == api.FileDeleted {
		if !c.st.whiteout {
			ev.Kind = kindOf(c.st.mode)
		}
		return ev
	}
	ev.Kind = kindOf(c.st.mode)
	ev.Mode = "0" + strings.TrimLeft(fmtOctal(uint32(c.st.mode.Perm())), "0")
	if ev.Mode == "0" {
		ev.Mode = "0000"
	}
	switch {
	case c.st.mode.IsRegular():
		ev.Size = c.st.size
		if c.st.size <= lim.HashFile && c.st.size <= *budget {
			if sum, n, ok := hashFile(upper, c.rel, lim.HashFile); ok {
				ev.SHA256 = sum
				*budget -= n
			}
		}
	case c.st.mode&fs.ModeSymlink != 0:
		if t, err := readlinkBeneath(upper, c.rel); err == nil {
			ev.Target = t
		}
	}
	return ev
}

func fmtOctal(v uint32) string {
	const digits = "01234567"
	b := []byte{'0', '0', '0', '0'}
	for i := 3; i >= 0; i-- {
		b[i] = digits[v&7]
		v >>= 3
	}
	return string(b)
}

// hashFile hashes up to max bytes of regular file rel below root.
func hashFile(root, rel string, max int64) (string, int64, bool) {
	f, err := openBeneath(root, rel)
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return "", 0, false
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, max+1))
	if err != nil || n > max {
		return "", n, false
	}
	return hex.EncodeToString(h.Sum(nil)), n, true
}

// openBeneath opens rel (slash-separated, relative) below directory root
// for reading without following a symbolic link in any component: the
// upper dir is the sandbox's, and a process inside may swap a directory
// for a link to a host path at any moment, so a path is never resolved
// by the host's kernel in one go. The last component is opened
// non-blocking (a fifo does not hang the recorder).
func openBeneath(root, rel string) (*os.File, error) {
	dir, base, err := openParentBeneath(root, rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// openParentBeneath opens the directory holding rel below root the same
// way and returns it with rel's last component.
func openParentBeneath(root, rel string) (int, string, error) {
	parts := strings.Split(rel, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return -1, "", fmt.Errorf("path %q is not clean and relative: %w", rel, errdefs.ErrInvalidArgument)
		}
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", err
	}
	for _, p := range parts[:len(parts)-1] {
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, "", err
		}
		fd = next
	}
	return fd, parts[len(parts)-1], nil
}

// readlinkBeneath reads symlink rel below root (see openBeneath).
func readlinkBeneath(root, rel string) (string, error) {
	dir, base, err := openParentBeneath(root, rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(dir)
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dir, base, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Package databases, as paths in the sandbox's filesystem.
const (
	dpkgInfo   = "var/lib/dpkg/info/"
	dpkgStatus = "var/lib/dpkg/status"
	apkDB      = "lib/apk/db/installed"
)

// packageChanges derives the packages a run installed or removed from
// its file changes: a dpkg package's file list (var/lib/dpkg/info/P.list),
// a pip distribution's NAME-VERSION.dist-info directory, a global npm
// package's node_modules/NAME/package.json, and the apk database before
// (apkBefore, nil when there was none) and after. Versions are read from
// the upper dir (dpkg status, package.json).
func packageChanges(upper string, changes []fileChange, apkBefore map[string]string) []api.PackageEvent {
	var out []api.PackageEvent
	var dpkgVersions map[string]string
	action := func(c fileChange) string {
		if c.change == api.FileDeleted {
			return "removed"
		}
		return "installed"
	}
	apkChanged := false
	for _, c := range changes {
		switch {
		case strings.HasPrefix(c.rel, dpkgInfo) && strings.HasSuffix(c.rel, ".list") && c.change != api.FileModified:
			name := strings.TrimSuffix(strings.TrimPrefix(c.rel, dpkgInfo), ".list")
			if strings.Contains(name, "/") {
				continue
			}
			name, _, _ = strings.Cut(name, ":")
			ev := api.PackageEvent{Manager: "dpkg", Name: name, Action: action(c)}
			if ev.Action == "installed" {
				if dpkgVersions == nil {
					dpkgVersions = readDpkgStatus(upper, dpkgStatus)
				}
				ev.Version = dpkgVersions[name]
			}
			out = append(out, ev)
		case c.change != api.FileModified && strings.HasSuffix(c.rel, ".dist-info") &&
			(strings.Contains(c.rel, "/site-packages/") || strings.Contains(c.rel, "/dist-packages/")):
			base := strings.TrimSuffix(path.Base(c.rel), ".dist-info")
			name, ver, ok := strings.Cut(base, "-")
			if !ok {
				continue
			}
			out = append(out, api.PackageEvent{Manager: "pip", Name: name, Version: ver, Action: action(c)})
		case c.change != api.FileModified && strings.HasSuffix(c.rel, "/package.json"):
			name, ok := npmGlobalName(c.rel)
			if !ok {
				continue
			}
			ev := api.PackageEvent{Manager: "npm", Name: name, Action: action(c)}
			if ev.Action == "installed" {
				ev.Version = readNpmVersion(upper, c.rel)
			}
			out = append(out, ev)
		case c.rel == apkDB:
			apkChanged = true
		}
	}
	if apkChanged {
		after := readAPK(upper, apkDB)
		out = append(out, diffPackages("apk", apkBefore, after)...)
	}
	return out
}

// npmGlobalName returns the package of a global node_modules'
// NAME/package.json or @SCOPE/NAME/package.json (not of a dependency
// nested below it).
func npmGlobalName(rel string) (string, bool) {
	for _, prefix := range []string{"usr/lib/node_modules/", "usr/local/lib/node_modules/"} {
		rest, ok := strings.CutPrefix(rel, prefix)
		if !ok {
			continue
		}
		parts := strings.Split(strings.TrimSuffix(rest, "/package.json"), "/")
		switch {
		case len(parts) == 1 && parts[0] != "" && !strings.HasPrefix(parts[0], "."):
			return parts[0], true
		case len(parts) == 2 && strings.HasPrefix(parts[0], "@"):
			return parts[0] + "/" + parts[1], true
		}
	}
	return "", false
}

// maxDBFile bounds a package database read.
const maxDBFile = 16 << 20

// readBounded reads up to maxDBFile bytes of regular file rel below root
// (see openBeneath); nil when it cannot.
func readBounded(root, rel string) []byte {
	f, err := openBeneath(root, rel)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxDBFile))
	return b
}

// readDpkgStatus returns the installed packages of a dpkg status file,
// name to version.
func readDpkgStatus(root, rel string) map[string]string {
	out := map[string]string{}
	var name, ver string
	var installed bool
	flush := func() {
		if name != "" && installed {
			out[name] = ver
		}
		name, ver, installed = "", "", false
	}
	sc := bufio.NewScanner(bytes.NewReader(readBounded(root, rel)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "Package: "):
			name = strings.TrimSpace(strings.TrimPrefix(line, "Package: "))
		case strings.HasPrefix(line, "Version: "):
			ver = strings.TrimSpace(strings.TrimPrefix(line, "Version: "))
		case strings.HasPrefix(line, "Status: "):
			installed = strings.HasSuffix(strings.TrimSpace(line), " installed")
		}
	}
	flush()
	return out
}

// readAPK returns the packages of an apk installed database, name to
// version (nil when there is none).
func readAPK(root, rel string) map[string]string {
	b := readBounded(root, rel)
	if b == nil {
		return nil
	}
	out := map[string]string{}
	var name string
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case line == "":
			name = ""
		case strings.HasPrefix(line, "P:"):
			name = line[2:]
			out[name] = ""
		case strings.HasPrefix(line, "V:") && name != "":
			out[name] = line[2:]
		}
	}
	return out
}

// diffPackages compares two name-to-version sets.
func diffPackages(manager string, before, after map[string]string) []api.PackageEvent {
	var out []api.PackageEvent
	for n, v := range after {
		if bv, ok := before[n]; !ok || bv != v {
			out = append(out, api.PackageEvent{Manager: manager, Name: n, Version: v, Action: "installed"})
		}
	}
	for n, v := range before {
		if _, ok := after[n]; !ok {
			out = append(out, api.PackageEvent{Manager: manager, Name: n, Version: v, Action: "removed"})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Action < out[j].Action
	})
	return out
}

// findAPK returns the apk database as the sandbox sees it: the top-most
// of dirs (upper first, then its layers) that has it (nil when none
// does, or a whiteout hides it).
func findAPK(dirs []string) map[string]string {
	for _, d := range dirs {
		dir, base, err := openParentBeneath(d, apkDB)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(dir)
		if err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil // a whiteout or anything else hides it
		}
		return readAPK(d, apkDB)
	}
	return nil
}

func readNpmVersion(root, rel string) string {
	var pkg struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(readBounded(root, rel), &pkg) != nil || len(pkg.Version) > 128 {
		return ""
	}
	return pkg.Version
}
