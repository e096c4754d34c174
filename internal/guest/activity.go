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
func countProcs(procDir string, self int) proto.ActivityReply {
	var r proto.ActivityReply
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return r
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(procDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
		stat := string(b)
		open, closing := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
		if open < 0 || closing < open || len(stat) < closing+3 {
			continue
		}
		if state := stat[closing+2]; state == 'Z' || state == 'X' {
			continue
		}
		r.Processes++
		if len(r.Sample) < proto.MaxActivitySample {
			r.Sample = append(r.Sample, strconv.Itoa(pid)+" "+truncate(stat[open+1:closing], 32))
		}
	}
	return r
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
