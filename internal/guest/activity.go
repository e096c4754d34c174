package guest

import (
	"os"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/guest/proto"
)

// activity answers proto.OpActivity: the processes living in the sandbox
// besides the guest, so that the host's idle policy can tell a sandbox
// whose background processes (exec -d, or what a command left running:
// "server &", a double fork) still run from an idle one.
//
// As a sandbox's PID 1 the guest sees its whole PID namespace in /proc.
// An Embedded guest has no namespace of its own: it counts the processes
// it started that still run.
func (s *server) activity() proto.ActivityReply {
	if s.opts.Embedded {
		var r proto.ActivityReply
		for _, p := range s.table.list() {
			if p.Running {
				r.Processes++
				if len(r.Sample) < proto.MaxActivitySample && len(p.Cmd) > 0 {
					r.Sample = append(r.Sample, strconv.Itoa(p.Pid)+" "+truncate(p.Cmd[0], 32))
				}
			}
		}
		return r
	}
	return countProcs("/proc", os.Getpid())
}

// countProcs counts the processes in procDir (a procfs) other than self
// and zombies, describing the first proto.MaxActivitySample. A process
// that exits while it is read is not counted.
//
// Nor are the code interpreter's server (`agentbox guest code-server`,
// internal/codeinterp) and its descendants, the interpreters holding its
// contexts: they wait for the next cell, which comes as an exec (itself
// activity while it runs), and counting them would keep every sandbox
// that ever ran code awake.
func countProcs(procDir string, self int) proto.ActivityReply {
	var r proto.ActivityReply
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return r
	}
	type proc struct {
		pid, ppid int
		comm      string
	}
	var procs []proc
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(procDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
		stat := string(b)
		open, closing := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
		if open < 0 || closing < open || len(stat) < closing+3 {
			continue
		}
		if state := stat[closing+2]; state == 'Z' || state == 'X' {
			continue
		}
		ppid := 0
		if f := strings.Fields(stat[closing+2:]); len(f) > 1 {
			ppid, _ = strconv.Atoi(f[1])
		}
		parent[pid] = ppid
		procs = append(procs, proc{pid, ppid, stat[open+1 : closing]})
	}
	codeServer := map[int]bool{}
	for _, p := range procs {
		if p.comm == "agentbox" && isCodeServer(procDir, p.pid) {
			codeServer[p.pid] = true
		}
	}
	for _, p := range procs {
		if underCodeServer(p.pid, parent, codeServer) {
			continue
		}
		r.Processes++
		if len(r.Sample) < proto.MaxActivitySample {
			r.Sample = append(r.Sample, strconv.Itoa(p.pid)+" "+truncate(p.comm, 32))
		}
	}
	return r
}

// isCodeServer reports whether process pid runs `agentbox guest
// code-server`.
func isCodeServer(procDir string, pid int) bool {
	b, err := os.ReadFile(procDir + "/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) >= 3 && args[1] == "guest" && args[2] == "code-server"
}

// underCodeServer reports whether pid is a code server or descends from
// one (the walk up is bounded: parent links read at different times may
// form a loop).
func underCodeServer(pid int, parent map[int]int, codeServer map[int]bool) bool {
	if len(codeServer) == 0 {
		return false
	}
	for i := 0; i < 64 && pid > 1; i++ {
		if codeServer[pid] {
			return true
		}
		pid = parent[pid]
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
