// Command nsclone is run inside a sandbox by TestAdversarialExecCaps: it
// tries to start a process in a new user namespace through clone3 (which
// the seccomp filter cannot inspect; Go uses clone3 for CLONE_NEWTIME) and
// through clone(2), and prints "escaped" for each that succeeded.
package main

import (
	"fmt"
	"syscall"
)

func main() {
	for _, c := range []struct {
		name  string
		flags uintptr
	}{
		{"clone3 user+time", syscall.CLONE_NEWUSER | 0x80 /* CLONE_NEWTIME */},
		{"clone user", syscall.CLONE_NEWUSER},
		{"clone3 time", 0x80},
	} {
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{
			Sys: &syscall.SysProcAttr{Cloneflags: c.flags},
		})
		if err != nil {
			fmt.Printf("%s: refused: %v\n", c.name, err)
			continue
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
		fmt.Printf("%s: escaped (pid %d)\n", c.name, pid)
	}
}
