package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// lockParent takes the host-wide exclusive lock that makes this process the
// only owner of its cgroup parent (Config.OwnParent). The lock is a flock on
// a file under /run/lock, released when the process exits, so a crashed
// daemon never holds it against its successor.
func lockParent(parent string) (*os.File, error) {
	dir := "/run/lock/agentbox"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cgroup parent lock: %w", err)
	}
	name := filepath.Join(dir, "cgroup-"+strings.ReplaceAll(parent, "/", "_")+".lock")
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cgroup parent lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("cgroup parent %q is owned by another agentbox daemon (%s): %w", parent, name, errdefs.ErrUnavailable)
	}
	return f, nil
}

// SweepOrphans implements runtime.Sweeper: it kills the processes of, and
// removes, every sandbox cgroup under the backend's cgroup parent whose id
// keep rejects, and, without a zygote pool, the cgroups of zygotes an
// earlier daemon left. It does so only when the backend owns its parent
// exclusively (Config.OwnParent): on a parent shared with other daemons an
// unknown cgroup may be another daemon's live sandbox, and it returns nil
// having touched nothing. It returns the ids it removed; errors of single
// cgroups are joined, the sweep goes on.
func (b *Backend) SweepOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	if b.parentLock == nil {
		return nil, nil
	}
	seen := b.childCgroups("*")
	var (
		swept []string
		errs  []error
	)
	for name := range seen {
		if strings.HasPrefix(name, zygotePrefix) {
			// An earlier daemon's zygotes were removed when this
			// backend started (removeZygoteCgroups); with a pool,
			// those left are its own.
			if b.pool != nil {
				continue
			}
		} else if !idPattern.MatchString(name) || keep(name) {
			continue
		}
		if err := b.removeCgroup(ctx, name); err != nil {
			errs = append(errs, err)
			continue
		}
		b.log.WarnContext(ctx, "removed orphaned cgroup", "cgroup", "/"+b.cgroupParent+"/"+name)
		swept = append(swept, name)
	}
	if b.mode == "hybrid" {
		sweepUnified(b.cgroupParent)
	}
	if len(errs) > 0 {
		return swept, fmt.Errorf("sweeping cgroups under %s: %w", b.cgroupParent, errors.Join(errs...))
	}
	return swept, nil
}

// childCgroups returns the names of the cgroup directories under the
// backend's parent, in any hierarchy, that match pattern (filepath.Match).
func (b *Backend) childCgroups(pattern string) map[string]bool {
	names := map[string]bool{}
	for _, root := range b.hierarchyRoots() {
		entries, err := os.ReadDir(filepath.Join(root, b.cgroupParent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if ok, _ := filepath.Match(pattern, e.Name()); ok && e.IsDir() {
				names[e.Name()] = true
			}
		}
	}
	return names
}

// removeCgroup kills every process in the cgroup <parent>/<name> and
// removes it from every hierarchy, also when a crash left it in some
// hierarchies only.
func (b *Backend) removeCgroup(ctx context.Context, name string) error {
	cg, err := loadCgroup(b.mode, "/"+b.cgroupParent+"/"+name)
	if err == nil && cg.killAll(ctx) == nil && cg.delete() == nil {
		return nil
	}
	// Gone from some hierarchies only (a crash mid-delete or mid-rename),
	// or it would not go as a whole: directory by directory.
	return removeCgroupDirs(ctx, b.hierarchyRoots(), b.cgroupParent, name)
}

// removeZygoteCgroups kills what is left in, and removes, the cgroups of
// an earlier daemon's zygotes. It looks in every hierarchy: a daemon
// killed while it renamed a claimed zygote's cgroup to the sandbox's (one
// hierarchy after the other) or deleted one (freezer first) leaves the
// zygote's name in some hierarchies only.
func (b *Backend) removeZygoteCgroups(ctx context.Context) {
	for name := range b.childCgroups(zygotePrefix + "*") {
		cctx, cancel := context.WithTimeout(ctx, teardownTimeout)
		err := b.removeCgroup(cctx, name)
		cancel()
		if err != nil {
			b.log.WarnContext(ctx, "removing an earlier daemon's zygote cgroup", "cgroup", "/"+b.cgroupParent+"/"+name, "err", err)
		}
	}
	// The empty delegated unified cgroups zygotes left (a zygote that
	// exited on its own once its daemon was gone), when the parent is
	// ours alone.
	if b.mode == "hybrid" && b.parentLock != nil {
		sweepUnified(b.cgroupParent)
	}
}

// removeCgroupDirs removes the cgroup <parent>/<name> directory by
// directory under each of roots, SIGKILLing whatever runs in each first.
// It is the fallback for a cgroup a crash left in some hierarchies only
// (without its freezer it cannot be loaded as a whole).
func removeCgroupDirs(ctx context.Context, roots []string, parent, name string) error {
	var errs []error
	for _, root := range roots {
		dir := filepath.Join(root, parent, name)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		procs := func() ([]int, error) { return readProcs(dir) }
		err := killUntilEmpty(ctx, dir, procs, func() error {
			pids, _ := readProcs(dir)
			for _, pid := range pids {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing cgroup dir: %w", err))
		}
	}
	// A hybrid host's guest of that name (started cold) also has a
	// delegated unified cgroup, with its per-exec cgroups below.
	if cgroupMode() == "hybrid" {
		dir := filepath.Join(unifiedRoot, parent, name)
		if _, err := os.Stat(dir); err == nil {
			procs := func() ([]int, error) { return readProcs(dir) }
			err := killUntilEmpty(ctx, dir, procs, func() error {
				return os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
			})
			if err == nil {
				err = removeCgroupTree(dir)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// hierarchyRoots are the host directories under which sandbox cgroups are
// made: the unified root on v2, each joined controller's mount otherwise.
func (b *Backend) hierarchyRoots() []string {
	if b.mode == "v2" {
		return []string{cgroupRoot}
	}
	subs, err := v1Hierarchy()
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range subs {
		if p, ok := s.(interface{ Path(string) string }); ok {
			out = append(out, p.Path("/"))
		}
	}
	return out
}
