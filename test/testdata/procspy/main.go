// Command procspy is the attacker of TestAdversarialExecSecret: run inside a
// sandbox, it tries every way a process of the same uid has to read another
// process's environment and prints what it found under the variable name
// given, rot13-encoded (so the daemon's redactor does not hide a leak).
//
// Usage: procspy PID VAR COREDIR
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var name string

func rot13(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return 'a' + (r-'a'+13)%26
		case r >= 'A' && r <= 'Z':
			return 'A' + (r-'A'+13)%26
		}
		return r
	}, s)
}

// look reports the value of name= found in b.
func look(how string, b []byte) {
	key := []byte(name + "=")
	i := bytes.Index(b, key)
	if i < 0 {
		fmt.Printf("%s: read %d bytes, no %s\n", how, len(b), name)
		return
	}
	v := b[i+len(key):]
	if j := bytes.IndexByte(v, 0); j >= 0 {
		v = v[:j]
	}
	fmt.Printf("LEAK %s: %s\n", how, rot13(string(v)))
}

func envRange(pid int) (uint64, uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// fields 50 and 51 of stat; f[0] is field 3.
	if len(f) < 49 {
		return 0, 0
	}
	a, _ := strconv.ParseUint(f[47], 10, 64)
	e, _ := strconv.ParseUint(f[48], 10, 64)
	return a, e
}

// stackRange is the [stack] mapping from maps, where the environment lives.
func stackRange(pid int) (uint64, uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		fmt.Printf("maps: %v\n", err)
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "[stack]") {
			r := strings.Fields(l)[0]
			lo, hi, _ := strings.Cut(r, "-")
			a, _ := strconv.ParseUint(lo, 16, 64)
			e, _ := strconv.ParseUint(hi, 16, 64)
			return a, e
		}
	}
	return 0, 0
}

func main() {
	pid, _ := strconv.Atoi(os.Args[1])
	name = os.Args[2]
	coreDir := os.Args[3]

	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil {
		fmt.Printf("environ: %v\n", err)
	} else {
		look("environ", b)
	}

	lo, hi := envRange(pid)
	fmt.Printf("env range from stat: %#x-%#x\n", lo, hi)
	if lo == 0 || hi <= lo {
		// stat hides the addresses from those who may not read the
		// process: guess the whole stack.
		lo, hi = stackRange(pid)
	}
	if lo == 0 || hi <= lo {
		lo, hi = 0x7ff000000000, 0x7ff000001000 // a guess; fails either way
	}
	n := hi - lo
	if n > 1<<20 {
		lo, n = hi-1<<20, 1<<20
	}

	if f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err != nil {
		fmt.Printf("mem: %v\n", err)
	} else {
		buf := make([]byte, n)
		k, err := f.ReadAt(buf, int64(lo))
		fmt.Printf("mem read: %d %v\n", k, err)
		look("mem", buf[:k])
		f.Close()
	}

	buf := make([]byte, n)
	local := []unix.Iovec{{Base: &buf[0], Len: n}}
	remote := []unix.RemoteIovec{{Base: uintptr(lo), Len: int(n)}}
	if k, err := unix.ProcessVMReadv(pid, local, remote, 0); err != nil {
		fmt.Printf("process_vm_readv: %v\n", err)
	} else {
		look("process_vm_readv", buf[:k])
	}

	if err := unix.PtraceAttach(pid); err != nil {
		fmt.Printf("ptrace attach: %v\n", err)
	} else {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
		out := make([]byte, 0, n)
		word := make([]byte, 8)
		for a := lo; a < lo+n; a += 8 {
			if _, err := unix.PtracePeekData(pid, uintptr(a), word); err != nil {
				break
			}
			out = append(out, word...)
		}
		look("ptrace", out)
		_ = unix.PtraceDetach(pid)
	}

	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		if _, err := unix.PidfdGetfd(fd, 0, 0); err != nil {
			fmt.Printf("pidfd_getfd: %v\n", err)
		} else {
			fmt.Printf("LEAK pidfd_getfd: got descriptor 0 of the victim\n")
		}
	}

	// A core dump: raise the victim's core limit, then crash it.
	lim := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Prlimit(pid, unix.RLIMIT_CORE, &lim, nil); err != nil {
		fmt.Printf("prlimit core unlimited: %v\n", err)
		lim = unix.Rlimit{}
		_ = unix.Prlimit(pid, unix.RLIMIT_CORE, nil, &lim)
		if lim.Max > 0 {
			lim.Cur = lim.Max
			err = unix.Prlimit(pid, unix.RLIMIT_CORE, &lim, nil)
			fmt.Printf("prlimit core to hard limit %d: %v\n", lim.Max, err)
		}
	}
	_ = syscall.Kill(pid, syscall.SIGSEGV)
	time.Sleep(2 * time.Second)
	_ = filepath.WalkDir(coreDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil {
			look("core file "+p, b)
		}
		return nil
	})
}
