package runtimetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Readers of what a backend applied to a sandbox's host cgroup, for a
// Fixture's Limits and Leftovers.

// CgroupInt reads the first field of a cgroup file as an integer: -1 for
// "max".
func CgroupInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Fields(string(b))[0]
	if s == "max" {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// CPUMax reads the CPUs the cpu.max of cgroup v2 directory dir allows:
// quota / period.
func CPUMax(t *testing.T, dir string) float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	q, _ := strconv.ParseFloat(f[0], 64)
	p, _ := strconv.ParseFloat(f[1], 64)
	return q / p
}

// CFSQuota reads the CPUs the cgroup v1 cpu directory dir allows:
// cpu.cfs_quota_us / cpu.cfs_period_us.
func CFSQuota(t *testing.T, dir string) float64 {
	t.Helper()
	quota := CgroupInt(t, filepath.Join(dir, "cpu.cfs_quota_us"))
	period := CgroupInt(t, filepath.Join(dir, "cpu.cfs_period_us"))
	return float64(quota) / float64(period)
}

// CgroupLeftovers lists the directories of cgroup <parent>/<id> still
// present under root (the cgroup mount, /sys/fs/cgroup): in the unified
// hierarchy and in any v1 hierarchy.
func CgroupLeftovers(root, parent, id string) []string {
	out, _ := filepath.Glob(filepath.Join(root, "*", parent, id))
	return append(out, Existing(filepath.Join(root, parent, id))...)
}

// Existing returns those of paths that exist (os.Lstat).
func Existing(paths ...string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}
