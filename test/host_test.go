package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// Host-side inspection: what a sandbox leaves on the host, seen from outside.

func apiResources(cpus float64, mem, pids int64) api.Resources {
	return api.Resources{CPUs: cpus, MemoryBytes: mem, PidsMax: pids}
}

func statUID(fi os.FileInfo) uint32 {
	return fi.Sys().(*syscall.Stat_t).Uid
}

// sandboxPids returns the host pids whose cgroup names the sandbox.
func sandboxPids(t testing.TB, id string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "/"+id+"\n") || strings.Contains(string(b), "/"+id+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func countSandboxProcs(t testing.TB, d *daemon, id string) int {
	return len(sandboxPids(t, id))
}

// cgroupDirs returns the sandbox's cgroup directories that exist.
func cgroupDirs(id string) []string {
	var out []string
	// Under the daemon's own parent (agentbox-<hash of its data dir>) or
	// the legacy shared one (agentbox); sandbox ids are unique.
	for _, pattern := range []string{"/sys/fs/cgroup/*/agentbox*/" + id, "/sys/fs/cgroup/agentbox*/" + id, "/sys/fs/cgroup/*/*/agentbox*/" + id} {
		m, _ := filepath.Glob(pattern)
		out = append(out, m...)
	}
	return out
}

// memoryOOMKills reads the OOM kill counter of the sandbox's memory cgroup.
func memoryOOMKills(t testing.TB, id string) int {
	t.Helper()
	for _, f := range []string{
		sandboxCgroupFile("memory", id, "memory.oom_control"), // v1
		sandboxCgroupFile("", id, "memory.events"),            // v2
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
	}
	t.Fatalf("no memory cgroup found for sandbox %s", id)
	return 0
}

// nsInodes returns the namespace links of pid (mnt, pid, net, ...).
func nsInodes(t testing.TB, pid int) []string {
	t.Helper()
	var out []string
	for _, ns := range []string{"mnt", "pid", "net", "uts", "ipc", "cgroup", "user"} {
		l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", ns))
		if err == nil {
			out = append(out, l)
		}
	}
	return out
}

// liveNamespaceHolders returns the pids holding any of the namespaces.
func liveNamespaceHolders(nss []string) []int {
	want := map[string]bool{}
	for _, n := range nss {
		want[n] = true
	}
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, ns := range []string{"mnt", "pid", "net", "uts", "ipc", "cgroup", "user"} {
			l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", ns))
			if err == nil && want[l] {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// hostMountsContaining lists host mount points whose path contains s.
func hostMountsContaining(t testing.TB, s string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
