package guest

import (
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestDomainsHidePrivateProcesses: a process started private cannot have
// its environment read by a process of the same uid started plain or
// private, while plain processes still read each other's. The processes
// run as nobody without capabilities, as sandbox processes run without
// CAP_SYS_PTRACE: Landlock lets a tracer holding it through.
func TestDomainsHidePrivateProcesses(t *testing.T) {
	testutil.RequiresRoot(t)
	d := newDomains(slog.New(slog.DiscardHandler))
	testutil.Requires(t, d.plain != nil, "Landlock ABI 2 (Linux 5.19, Landlock enabled)")

	start := func(private bool, argv []string, env []string) int {
		t.Helper()
		pid, err := d.fork(private, func() (int, error) {
			return syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2},
				Sys: &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}})
		})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	wait := func(pid int) int {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatal(err)
		}
		return ws.ExitStatus()
	}
	kill := func(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL); wait(pid) }

	sleepBin := "/bin/sleep"
	if _, err := os.Stat(sleepBin); err != nil {
		sleepBin = "/usr/bin/sleep"
	}
	private := start(true, []string{sleepBin, "30"}, []string{"SECRET=private"})
	defer kill(private)
	plain := start(false, []string{sleepBin, "30"}, []string{"OPEN=plain"})
	defer kill(plain)

	cat := func(private bool, pid int) int {
		return wait(start(private, []string{"/bin/sh", "-c", "cat /proc/" + strconv.Itoa(pid) + "/environ >/dev/null 2>&1"}, nil))
	}
	if code := cat(false, private); code == 0 {
		t.Errorf("a plain process read a private process's environment")
	}
	if code := cat(true, private); code == 0 {
		t.Errorf("another private process read a private process's environment")
	}
	if code := cat(false, plain); code != 0 {
		t.Errorf("a plain process could not read another plain process's environment (exit %d)", code)
	}
}
