package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// machine describes the host a run was measured on.
type machine struct {
	Kernel   string
	CPU      string
	NProc    int
	Memory   string
	Cgroup   string
	Date     string
	Go       string
	Runtimes []string // versions of the peer tools found
}

func describeMachine() machine {
	m := machine{
		Kernel: "unknown",
		CPU:    cpuModel(),
		NProc:  runtime.NumCPU(),
		Memory: memTotal(),
		Cgroup: cgroupMode(),
		Date:   time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Go:     runtime.Version(),
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	for _, tool := range []string{"runc", "crun"} {
		if p, err := exec.LookPath(tool); err == nil {
			m.Runtimes = append(m.Runtimes, runtimeVersion(p))
		}
	}
	if out, err := exec.Command("unshare", "--version").Output(); err == nil {
		m.Runtimes = append(m.Runtimes, firstLine(string(out)))
	}
	return m
}

// cpuModel returns the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		return v
	}
	return "unknown"
}

// memTotal returns MemTotal of /proc/meminfo in GiB.
func memTotal() string {
	v := procField("/proc/meminfo", "MemTotal")
	var kb int64
	if _, err := fmt.Sscanf(v, "%d kB", &kb); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// cgroupMode reports "v2" (unified), "hybrid" (v1 controllers plus a
// cgroup2 mount at /sys/fs/cgroup/unified), "v1" or "unknown".
func cgroupMode() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return "unknown"
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "v2"
	}
	if err := unix.Statfs("/sys/fs/cgroup/unified", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "hybrid"
	}
	return "v1"
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(line)
}
