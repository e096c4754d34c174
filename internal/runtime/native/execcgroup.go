package native

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Per-exec cgroups.
//
// The guest gives every exec a cgroup of its own (a child of the cgroup it
// was born in), so that a timeout or a SIGKILL of the exec can end every
// process the exec started, however it detached itself: a new session, a
// double fork that reparents it to PID 1, a new process group. Tracking
// sessions or process groups (or a child subreaper) cannot follow a
// process that reparents to PID 1 and starts a session of its own; cgroup
// membership is inherited on fork and cannot be left from inside.
//
// Those child cgroups live on the cgroup v2 hierarchy, where the guest
// starts each exec directly inside its cgroup (clone3 CLONE_INTO_CGROUP,
// which costs no migration) and kills it with cgroup.kill. On a pure v2
// host the v2 cgroup is the sandbox's own; on a hybrid host (controllers on
// v1) the guest is born, besides its v1 cgroups, in a controller-less
// cgroup of the unified hierarchy made for it (unifiedRoot/<parent>/<name>).
// On a legacy host without the unified hierarchy there are no per-exec
// cgroups and an exec's timeout reaches its process group only.
//
// The host delegates that cgroup to the sandbox's root as cgroup v2
// delegation prescribes (cgroup-v2.rst, "Delegation"): the directory and
// its cgroup.procs, cgroup.threads and cgroup.subtree_control belong to
// the sandbox's root uid; every limit file stays the host's, so the guest
// can make sub-cgroups and move its processes between them but never
// raise a limit, and a process cannot leave the delegated subtree (a move
// needs write access to the common ancestor's cgroup.procs, and the
// guest's cgroup namespace is rooted at the delegated cgroup). The guest
// reaches its cgroup through a detached cgroup2 mount of its own cgroup
// namespace (nsinit.ExecCgroupDir). Sandbox processes never see a cgroup
// filesystem: none is mounted inside, and they cannot mount one (no
// CAP_SYS_ADMIN).

// unifiedRoot is the mount point of the v2 hierarchy on a hybrid host.
const unifiedRoot = "/sys/fs/cgroup/unified"

// delegatedFiles are the files of a cgroup handed to its delegatee with
// the directory itself ("").
var delegatedFiles = []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}

// delegate gives the cgroup directory dir to host uid and gid (the
// sandbox's root).
func delegate(dir string, uid, gid uint32) error {
	for _, f := range delegatedFiles {
		p := filepath.Join(dir, f)
		if err := os.Lchown(p, int(uid), int(gid)); err != nil && !(f == "cgroup.threads" && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("delegating cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// unifiedAvailable reports whether a hybrid host mounts the unified
// hierarchy (with cgroup.kill, Linux 5.14) at unifiedRoot.
func unifiedAvailable() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(unifiedRoot, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return false
	}
	_, err := os.Stat(filepath.Join(unifiedRoot, "cgroup.procs"))
	return err == nil
}

// newUnifiedDir makes the controller-less unified cgroup path (relative to
// the hierarchy root, e.g. "/agentbox/<id>") of a guest on a hybrid host
// and delegates it to uid and gid. It returns the host directory, or ""
// when the host has no unified hierarchy.
func newUnifiedDir(path string, uid, gid uint32) (string, error) {
	if !unifiedAvailable() {
		return "", nil
	}
	dir := filepath.Join(unifiedRoot, path)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("creating unified cgroup parent: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("unified cgroup %s: %w", path, errdefs.ErrAlreadyExists)
		}
		return "", fmt.Errorf("creating unified cgroup %s: %w", path, err)
	}
	if err := delegate(dir, uid, gid); err != nil {
		_ = unix.Rmdir(dir)
		return "", err
	}
	return dir, nil
}

// removeCgroupTree removes the cgroup directory dir and every cgroup below
// it, deepest first (a cgroup directory cannot be removed with
// os.RemoveAll: its control files are not unlinkable). A missing dir is
// not an error; a cgroup still holding a process is (EBUSY).
func removeCgroupTree(dir string) error {
	if dir == "" {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing cgroup %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing cgroup %s: %w", dir, err)
	}
	return nil
}

// removeCgroupChildren removes every cgroup below dir, leaving dir.
func removeCgroupChildren(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing sub-cgroups of %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unifiedDirOf returns the host directory of the delegated unified cgroup
// that pid (a guest or one of its processes, of a hybrid host) is in or
// below, when it lies under parent (e.g. "/agentbox"); "" otherwise.
func unifiedDirOf(pid int, parent string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	return unifiedDirIn(string(b), parent)
}

// unifiedDirIn is unifiedDirOf for the text of a /proc/<pid>/cgroup file:
// the directory below unifiedRoot of the first path component under parent
// of its "0::" (unified) line.
func unifiedDirIn(procCgroup, parent string) string {
	if !strings.HasPrefix(parent, "/") || filepath.Clean(parent) != parent || parent == "/" {
		return ""
	}
	for line := range strings.SplitSeq(procCgroup, "\n") {
		p, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		if !strings.HasPrefix(p, "/") {
			return ""
		}
		rest, ok := strings.CutPrefix(filepath.Clean(p), parent+"/")
		if !ok || rest == "" {
			return ""
		}
		name, _, _ := strings.Cut(rest, "/")
		return filepath.Join(unifiedRoot, parent, name)
	}
	return ""
}

// findUnified returns the delegated unified cgroup of the sandbox whose v1
// cgroup c a daemon loads (to re-adopt or remove it): the one named like c
// (a guest started cold), else the one c's processes are in (a prespawned
// guest's keeps the zygote's name), else "".
func findUnified(c *cgroupV1) string {
	dir := filepath.Join(unifiedRoot, c.path)
	if _, err := os.Stat(dir); err == nil {
		return dir
	}
	pids, err := c.procs()
	if err != nil {
		return ""
	}
	for _, pid := range pids {
		if d := unifiedDirOf(pid, filepath.Dir(c.path)); d != "" {
			return d
		}
	}
	return ""
}

// sweepUnified removes every cgroup under unifiedRoot/<parent> that holds
// no process (a guest that died while no daemon watched leaves its
// delegated cgroup behind; the guests of live sandboxes and zygotes are in
// theirs, which rmdir refuses to remove).
func sweepUnified(parent string) {
	dir := filepath.Join(unifiedRoot, parent)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		if b, err := os.ReadFile(filepath.Join(sub, "cgroup.events")); err != nil || !strings.Contains(string(b), "populated 0") {
			continue
		}
		_ = removeCgroupTree(sub)
	}
}
