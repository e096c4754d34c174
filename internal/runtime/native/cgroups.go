package native

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

const (
	cgroupRoot    = "/sys/fs/cgroup"
	cfsPeriod     = 100000 // µs
	killRounds    = 100
	killRoundWait = 20 * time.Millisecond
)

// cgroupManager is the backend's view of one sandbox cgroup, on either
// hierarchy version. Implementations are safe for concurrent use only as far
// as the kernel files are; the sandbox serialises its own calls.
type cgroupManager interface {
	// addProc moves pid (and only pid) into the cgroup.
	addProc(pid int) error
	// contains reports whether pid is a member of the cgroup.
	contains(pid int) (bool, error)
	// procs lists the pids in the cgroup (recursively).
	procs() ([]int, error)
	// killAll SIGKILLs every process in the cgroup until it is empty or ctx
	// ends.
	killAll(ctx context.Context) error
	freeze(ctx context.Context) error
	thaw(ctx context.Context) error
	stats() (runtime.Stats, error)
	// delete removes the cgroup directories; it fails while processes remain.
	delete() error
	// dirs are the host directories of the cgroup (for leak checks).
	dirs() []string
	// cpuUsage is the CPU time (ns) the cgroup's tasks have used.
	cpuUsage() (int64, error)
	// cpuFiles are the cgroup's cpu.idle and thread list files, or ""
	// when the cpu controller is not there.
	cpuFiles() (idle, tasks string)
	// execRoot is the host directory of the v2 cgroup delegated to the
	// guest for its per-exec cgroups (see execcgroup.go), or "".
	execRoot() string
}

// cgroupMode names the host's cgroup layout: "v2" when only the unified
// hierarchy is mounted, "hybrid" or "v1" otherwise (controllers on v1).
func cgroupMode() string {
	switch cgroups.Mode() {
	case cgroups.Unified:
		return "v2"
	case cgroups.Hybrid:
		return "hybrid"
	case cgroups.Legacy:
		return "v1"
	default:
		return ""
	}
}

// v1Controllers are the v1 hierarchies a sandbox joins. cpuset, devices and
// others are left alone: they add setup cost and enforce nothing we need.
var v1Controllers = map[cgroup1.Name]bool{
	cgroup1.Freezer: true, cgroup1.Pids: true, cgroup1.Cpu: true,
	cgroup1.Cpuacct: true, cgroup1.Memory: true,
}

// v1Hierarchy returns the v1 subsystems a sandbox joins. The mount table
// is read once per process: parsing it on every create and claim cost
// about a millisecond, and hierarchies are not remounted under a running
// daemon.
var v1Hierarchy = sync.OnceValues(readV1Hierarchy)

func readV1Hierarchy() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if v1Controllers[s.Name()] {
			out = append(out, s)
		}
	}
	return out, nil
}

// newCgroup creates the cgroup at path (relative to the hierarchy roots,
// e.g. "/agentbox/<id>") with the given limits.
func newCgroup(mode, path string, res runtime.Resources) (cgroupManager, error) {
	if mode == "v2" {
		return newCgroupV2(path, res)
	}
	if mode == "" {
		return nil, fmt.Errorf("no cgroup hierarchy mounted at %s: %w", cgroupRoot, errdefs.ErrFailedPrecondition)
	}
	return newCgroupV1(path, res)
}

// loadCgroup opens an existing cgroup; it wraps errdefs.ErrNotFound when the
// cgroup does not exist.
func loadCgroup(mode, path string) (cgroupManager, error) {
	if mode == "v2" {
		dir := filepath.Join(cgroupRoot, path)
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", path, errdefs.ErrNotFound)
		}
		m, err := cgroup2.Load(path)
		if err != nil {
			return nil, fmt.Errorf("loading cgroup %s: %w", path, err)
		}
		return &cgroupV2{m: m, path: path, ctr: v2Counters(dir)}, nil
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("cgroup %s: %w", path, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("loading cgroup %s: %w", path, err)
	}
	c, err := v1FromCgroup(cg, path)
	if err != nil {
		return nil, err
	}
	if mode == "hybrid" {
		c.unified = findUnified(c)
	}
	return c, nil
}

// --- v1 ---

type cgroupV1 struct {
	cg   cgroup1.Cgroup
	path string
	// unified is the host directory of the guest's delegated cgroup on
	// the unified hierarchy of a hybrid host ("" if none); its name need
	// not match path (v2 cgroups cannot be renamed).
	unified string
	// dir maps controller name to its host directory.
	dir map[cgroup1.Name]string
	ctr *counters
}

func newCgroupV1(path string, res runtime.Resources) (cgroupManager, error) {
	subs, err := v1Hierarchy()
	if err != nil {
		return nil, fmt.Errorf("reading v1 hierarchies: %w", err)
	}
	spec := v1Resources(subs, res)
	cg, err := cgroup1.New(cgroup1.StaticPath(path), spec, cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return subs, nil }))
	if err != nil {
		// New may have created some hierarchies before failing.
		if old, lerr := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(v1Hierarchy)); lerr == nil {
			_ = old.Delete()
		}
		return nil, fmt.Errorf("creating v1 cgroup %s: %w", path, err)
	}
	return v1FromCgroup(cg, path)
}

// v1Resources translates limits into the OCI form cgroup1 applies.
func v1Resources(subs []cgroup1.Subsystem, res runtime.Resources) *specs.LinuxResources {
	spec := &specs.LinuxResources{}
	if res.CPUs > 0 {
		period := uint64(cfsPeriod)
		quota := int64(res.CPUs * cfsPeriod)
		spec.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if res.MemoryBytes > 0 {
		limit := res.MemoryBytes
		spec.Memory = &specs.LinuxMemory{Limit: &limit}
		for _, s := range subs {
			if s.Name() != cgroup1.Memory {
				continue
			}
			if p, ok := s.(interface{ Path(string) string }); ok {
				if _, err := os.Stat(filepath.Join(p.Path("/"), "memory.memsw.limit_in_bytes")); err == nil {
					swap := limit // memory+swap == memory: no swap at all
					spec.Memory.Swap = &swap
				}
			}
		}
	}
	if res.PidsMax > 0 {
		n := res.PidsMax
		spec.Pids = &specs.LinuxPids{Limit: &n}
	}
	return spec
}

// renameTo renames the cgroup to path in every hierarchy and applies res.
// Renaming moves no process, so unlike writing to cgroup.procs it never
// waits for an RCU grace period; prespawned guests are placed in a cgroup
// of their own in the background and renamed into the sandbox's on claim.
// Only v1 hierarchies support rename.
func (c *cgroupV1) renameTo(path string, res runtime.Resources) (*cgroupV1, error) {
	renamed := map[string]bool{} // co-mounted controllers share a dir
	for name, dir := range c.dir {
		root := strings.TrimSuffix(dir, c.path)
		if root == dir {
			return nil, fmt.Errorf("cgroup %s: %s dir %s does not end in its path", c.path, name, dir)
		}
		real, err := filepath.EvalSymlinks(root)
		if err != nil {
			return nil, fmt.Errorf("renaming cgroup %s: %w", c.path, err)
		}
		if renamed[real] {
			continue
		}
		renamed[real] = true
		if err := os.Rename(dir, root+path); err != nil {
			return nil, fmt.Errorf("renaming cgroup %s to %s: %w", c.path, path, err)
		}
	}
	subs, err := v1Hierarchy()
	if err != nil {
		return nil, err
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(path), cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return subs, nil }))
	if err != nil {
		return nil, fmt.Errorf("loading renamed cgroup %s: %w", path, err)
	}
	nc, err := v1FromCgroup(cg, path)
	if err != nil {
		return nil, err
	}
	nc.unified = c.unified
	if err := cg.Update(v1Resources(subs, res)); err != nil {
		return nil, fmt.Errorf("setting limits of cgroup %s: %w", path, err)
	}
	return nc, nil
}

// v1Dir is the host directory of path in the v1 hierarchy of controller
// name, or "" when that controller is not mounted.
func v1Dir(name cgroup1.Name, path string) (string, error) {
	subs, err := v1Hierarchy()
	if err != nil {
		return "", fmt.Errorf("reading v1 hierarchies: %w", err)
	}
	for _, s := range subs {
		if p, ok := s.(interface{ Path(string) string }); ok && s.Name() == name {
			return p.Path(path), nil
		}
	}
	return "", nil
}

func v1FromCgroup(cg cgroup1.Cgroup, path string) (*cgroupV1, error) {
	c := &cgroupV1{cg: cg, path: path, dir: map[cgroup1.Name]string{}}
	for _, s := range cg.Subsystems() {
		if p, ok := s.(interface{ Path(string) string }); ok {
			c.dir[s.Name()] = p.Path(path)
		}
	}
	if c.dir[cgroup1.Freezer] == "" {
		return nil, fmt.Errorf("v1 freezer hierarchy missing: %w", errdefs.ErrFailedPrecondition)
	}
	c.ctr = v1Counters(c.dir[cgroup1.Cpuacct], c.dir[cgroup1.Memory], c.dir[cgroup1.Pids])
	return c, nil
}

func (c *cgroupV1) addProc(pid int) error {
	if err := c.cg.AddProc(uint64(pid)); err != nil {
		return fmt.Errorf("adding pid %d to cgroup %s: %w", pid, c.path, err)
	}
	return nil
}

func (c *cgroupV1) contains(pid int) (bool, error) {
	return procInCgroup(pid, "freezer", c.path)
}

func (c *cgroupV1) procs() ([]int, error) {
	return readProcs(c.dir[cgroup1.Freezer])
}

func (c *cgroupV1) setFreezer(ctx context.Context, state string) error {
	file := filepath.Join(c.dir[cgroup1.Freezer], "freezer.state")
	for {
		if err := os.WriteFile(file, []byte(state), 0); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		cur, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("reading %s: %w", file, err)
		}
		if strings.TrimSpace(string(cur)) == state {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s: freezer did not reach %s: %w", c.path, state, errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
		case <-time.After(time.Millisecond):
		}
	}
}

func (c *cgroupV1) freeze(ctx context.Context) error {
	if err := c.setFreezer(ctx, "FROZEN"); err != nil {
		_ = c.setFreezer(context.WithoutCancel(ctx), "THAWED")
		return err
	}
	return nil
}

func (c *cgroupV1) thaw(ctx context.Context) error { return c.setFreezer(ctx, "THAWED") }

// killAll freezes the cgroup so nothing can fork while we look, SIGKILLs
// every member, thaws so the signals are delivered, and repeats until the
// cgroup is empty.
func (c *cgroupV1) killAll(ctx context.Context) error {
	return killUntilEmpty(ctx, c.path, c.procs, func() error {
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		ferr := c.setFreezer(fctx, "FROZEN")
		cancel()
		if pids, err := c.procs(); err == nil {
			for _, pid := range pids {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		if err := c.setFreezer(context.WithoutCancel(ctx), "THAWED"); err != nil && ferr == nil {
			return err
		}
		return nil
	})
}

// killUntilEmpty runs one kill round after another, killRoundWait apart,
// until procs reports the cgroup at path empty (or gone), or killRounds
// rounds or ctx have run out.
func killUntilEmpty(ctx context.Context, path string, procs func() ([]int, error), round func() error) error {
	for n := 0; ; n++ {
		pids, err := procs()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if n >= killRounds || ctx.Err() != nil {
			return fmt.Errorf("cgroup %s still has %d processes: %w", path, len(pids), errdefs.ErrDeadlineExceeded)
		}
		if err := round(); err != nil {
			return err
		}
		time.Sleep(killRoundWait)
	}
}

// stats reads the four counters it reports straight from their files: the
// library's full Stat parses every file of every controller (≈0.4 ms), and
// the execute pipeline samples a sandbox at the start and the end of every
// run.
func (c *cgroupV1) stats() (runtime.Stats, error) {
	s, err := c.ctr.stats()
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading stats of cgroup %s: %w", c.path, err)
	}
	return s, nil
}

// delete removes the cgroup from every hierarchy. Its processes must be
// gone (killAll). Each directory is removed with one rmdir: the library's
// Delete first walks every hierarchy's directory (an lstat per control
// file, a few hundred per sandbox) to look for processes. Anything rmdir
// cannot do alone (sub-cgroups; a task still leaving) goes to the library.
func (c *cgroupV1) delete() error {
	c.ctr.close()
	if err := removeCgroupTree(c.unified); err != nil {
		return err
	}
	done := map[string]bool{} // co-mounted controllers share a dir
	for _, dir := range c.dir {
		if done[dir] {
			continue
		}
		done[dir] = true
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return c.deleteSlow()
		}
	}
	return nil
}

// deleteSlow is the library's Delete, which retries and recurses.
func (c *cgroupV1) deleteSlow() error {
	if err := c.cg.Delete(); err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return fmt.Errorf("deleting cgroup %s: %w", c.path, err)
	}
	return nil
}

func (c *cgroupV1) dirs() []string {
	var out []string
	for _, d := range c.dir {
		out = append(out, d)
	}
	if c.unified != "" {
		out = append(out, c.unified)
	}
	return out
}

func (c *cgroupV1) execRoot() string { return c.unified }

func (c *cgroupV1) cpuUsage() (int64, error) { return c.ctr.read(cpuCounter) }

func (c *cgroupV1) cpuFiles() (idle, tasks string) {
	d := c.dir[cgroup1.Cpu]
	if d == "" {
		return "", ""
	}
	return filepath.Join(d, "cpu.idle"), filepath.Join(d, "tasks")
}

// --- v2 ---

type cgroupV2 struct {
	m    *cgroup2.Manager
	path string
	ctr  *counters
}

func newCgroupV2(path string, res runtime.Resources) (cgroupManager, error) {
	r := &cgroup2.Resources{}
	if res.CPUs > 0 {
		period := uint64(cfsPeriod)
		quota := int64(res.CPUs * cfsPeriod)
		r.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &period)}
	}
	if res.MemoryBytes > 0 {
		limit := res.MemoryBytes
		r.Memory = &cgroup2.Memory{Max: &limit}
	}
	if res.PidsMax > 0 {
		r.Pids = &cgroup2.Pids{Max: res.PidsMax}
	}
	m, err := cgroup2.NewManager(cgroupRoot, path, r)
	if err != nil {
		return nil, fmt.Errorf("creating v2 cgroup %s: %w", path, err)
	}
	c := &cgroupV2{m: m, path: path, ctr: v2Counters(filepath.Join(cgroupRoot, path))}
	// No swap: written only where the kernel accounts swap (the file is
	// missing otherwise, and then there is no swap to escape to).
	if res.MemoryBytes > 0 {
		swapMax := filepath.Join(cgroupRoot, path, "memory.swap.max")
		if _, err := os.Stat(swapMax); err == nil {
			if err := os.WriteFile(swapMax, []byte("0"), 0); err != nil {
				_ = c.delete()
				return nil, fmt.Errorf("disabling swap of cgroup %s: %w", path, err)
			}
		}
	}
	return c, nil
}

func (c *cgroupV2) addProc(pid int) error {
	if err := c.m.AddProc(uint64(pid)); err != nil {
		return fmt.Errorf("adding pid %d to cgroup %s: %w", pid, c.path, err)
	}
	return nil
}

func (c *cgroupV2) contains(pid int) (bool, error) { return procInCgroup(pid, "", c.path) }

func (c *cgroupV2) procs() ([]int, error) { return readProcs(filepath.Join(cgroupRoot, c.path)) }

func (c *cgroupV2) setFrozen(ctx context.Context, v string) error {
	dir := filepath.Join(cgroupRoot, c.path)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(v), 0); err != nil {
		return fmt.Errorf("freezing cgroup %s: %w", c.path, err)
	}
	want := "frozen " + v
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("reading cgroup.events of %s: %w", c.path, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line == want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s: freeze state %s not reached: %w", c.path, v, errors.Join(errdefs.ErrDeadlineExceeded, ctx.Err()))
		case <-time.After(time.Millisecond):
		}
	}
}

func (c *cgroupV2) freeze(ctx context.Context) error {
	if err := c.setFrozen(ctx, "1"); err != nil {
		_ = c.setFrozen(context.WithoutCancel(ctx), "0")
		return err
	}
	return nil
}

func (c *cgroupV2) thaw(ctx context.Context) error { return c.setFrozen(ctx, "0") }

func (c *cgroupV2) killAll(ctx context.Context) error {
	if err := killUntilEmpty(ctx, c.path, c.procs, func() error {
		if err := c.m.Kill(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("killing cgroup %s: %w", c.path, err)
		}
		return nil
	}); err != nil {
		return err
	}
	waitUnpopulated(ctx, filepath.Join(cgroupRoot, c.path))
	return nil
}

// waitUnpopulated waits, as long as the kill rounds may take, until the v2
// cgroup at dir is no longer populated (or gone). cgroup.procs leaves out
// a task that is exiting, but the cgroup stays populated, and rmdir says
// EBUSY, until the task is released: for a sandbox's guest, until its
// parent reaps it, which a slow host (a TCG VM) can take longer over than
// the library's rmdir retries (150 ms). When the wait runs out, delete
// reports what is left.
func waitUnpopulated(ctx context.Context, dir string) {
	for n := 0; n < killRounds && ctx.Err() == nil; n++ {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil || strings.Contains(string(b), "populated 0") {
			return
		}
		time.Sleep(killRoundWait)
	}
}

func (c *cgroupV2) stats() (runtime.Stats, error) {
	s, err := c.ctr.stats()
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading stats of cgroup %s: %w", c.path, err)
	}
	return s, nil
}

func (c *cgroupV2) delete() error {
	c.ctr.close()
	// The guest's per-exec cgroups first: rmdir refuses a parent.
	if err := removeCgroupChildren(filepath.Join(cgroupRoot, c.path)); err != nil {
		return fmt.Errorf("deleting cgroup %s: %w", c.path, err)
	}
	if err := c.m.Delete(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting cgroup %s: %w", c.path, err)
	}
	return nil
}

func (c *cgroupV2) dirs() []string { return []string{filepath.Join(cgroupRoot, c.path)} }

func (c *cgroupV2) execRoot() string { return filepath.Join(cgroupRoot, c.path) }

func (c *cgroupV2) cpuUsage() (int64, error) { return c.ctr.read(cpuCounter) }

func (c *cgroupV2) cpuFiles() (idle, tasks string) {
	d := filepath.Join(cgroupRoot, c.path)
	if _, err := os.Stat(filepath.Join(d, "cpu.idle")); err != nil {
		return "", ""
	}
	return filepath.Join(d, "cpu.idle"), filepath.Join(d, "cgroup.threads")
}

// --- helpers ---

// readProcs reads cgroup.procs of dir and of every descendant.
func readProcs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids, err
}

// procInCgroup reports whether /proc/<pid>/cgroup places pid at path in the
// v1 hierarchy holding controller, or in the unified hierarchy when
// controller is "".
func procInCgroup(pid int, controller, path string) (bool, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		match := parts[1] == "" && controller == ""
		if controller != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					match = true
				}
			}
		}
		if match {
			return parts[2] == path, nil
		}
	}
	return false, sc.Err()
}
