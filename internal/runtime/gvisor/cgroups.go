package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// cgroupRoot is where the hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupDirs are the directories of sandbox id's cgroup in every hierarchy
// (v1 and hybrid: one per mounted hierarchy, the unified one included),
// whether or not they exist.
func (b *Backend) cgroupDirs(id string) []string {
	rel := b.cgroupPath(id)
	if b.mode == "v2" {
		return []string{filepath.Join(cgroupRoot, rel)}
	}
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() { // symlinks (cpu -> cpu,cpuacct) name a hierarchy twice
			out = append(out, filepath.Join(cgroupRoot, e.Name(), rel))
		}
	}
	return out
}

// killCgroup kills every process in dirs until they are empty, then
// removes them. Missing dirs are skipped.
func killCgroup(ctx context.Context, dirs []string) error {
	deadline := time.Now().Add(teardownTimeout)
	for {
		busy := false
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					busy = true
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if !busy {
			var errs []error
			for _, d := range dirs {
				if err := rmdirRetry(d); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cgroup %v not empty after kill: %w", dirs, errdefs.ErrDeadlineExceeded)
		}
		time.Sleep(destroyPollInterval)
	}
}

// rmdirRetry removes an empty cgroup dir, retrying while the kernel still
// counts an exiting task (EBUSY).
func rmdirRetry(d string) error {
	for i := 0; ; i++ {
		err := unix.Rmdir(d)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.EBUSY || i >= 100 {
			return fmt.Errorf("removing cgroup %s: %w", d, err)
		}
		time.Sleep(destroyPollInterval)
	}
}

// readStats reads the counters of the cgroup rel.
func readStats(mode, rel string) (runtime.Stats, error) {
	var st runtime.Stats
	if mode == "v2" {
		dir := filepath.Join(cgroupRoot, rel)
		usec, err := keyedValue(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return st, err
		}
		st.CPUTime = time.Duration(usec) * time.Microsecond
		if st.MemoryBytes, err = intFile(filepath.Join(dir, "memory.current")); err != nil {
			return st, err
		}
		if st.Pids, err = intFile(filepath.Join(dir, "pids.current")); err != nil {
			return st, err
		}
		st.OOMKills, _ = readOOMKills(mode, rel)
		return st, nil
	}
	ns, err := intFile(filepath.Join(cgroupRoot, "cpuacct", rel, "cpuacct.usage"))
	if err != nil {
		return st, err
	}
	st.CPUTime = time.Duration(ns)
	if st.MemoryBytes, err = intFile(filepath.Join(cgroupRoot, "memory", rel, "memory.usage_in_bytes")); err != nil {
		return st, err
	}
	if st.Pids, err = intFile(filepath.Join(cgroupRoot, "pids", rel, "pids.current")); err != nil {
		return st, err
	}
	st.OOMKills, _ = readOOMKills(mode, rel)
	return st, nil
}

// readOOMKills reads the oom_kill count of cgroup rel: memory.events (v2)
// or memory.oom_control (v1 and hybrid). A cgroup that is gone is
// os.ErrNotExist; a counter the kernel does not report reads as 0.
func readOOMKills(mode, rel string) (int64, error) {
	p := filepath.Join(cgroupRoot, "memory", rel, "memory.oom_control")
	if mode == "v2" {
		p = filepath.Join(cgroupRoot, rel, "memory.events")
	}
	n, err := keyedValue(p, "oom_kill")
	if errors.Is(err, errNoKey) {
		return 0, nil
	}
	return n, err
}

// intFile reads a file holding one integer.
func intFile(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// keyedValue reads the value of key in a "key value" per line file.
func keyedValue(p, key string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: %w %s", p, errNoKey, key)
}

// errNoKey is keyedValue's error for a file without the key.
var errNoKey = errors.New("no key")
