package forker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// The test binary is its own helper: run with helperEnv set it serves as
// the forker.
const helperEnv = "AGENTBOX_FORKER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		Main()
	}
	os.Exit(m.Run())
}

func startHelper(t *testing.T) *Client {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := start(exe, nil, []string{helperEnv + "=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// run spawns sh -c script with stdin /dev/null, stdout into a pipe, and
// extra (fd 3 on) and returns its pid, pidfd and output reader.
func run(t *testing.T, c *Client, script string, extra ...*os.File) (int, int, *os.File) {
	t.Helper()
	sh := testutil.RequiresBinary(t, "sh")
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	t.Cleanup(func() { r.Close() })
	fds := []int{int(devnull.Fd()), int(w.Fd()), int(w.Fd())}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	pid, pidfd, err := c.Spawn(Request{Path: sh, Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/"}, fds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pidfd) })
	return pid, pidfd, r
}

// exited waits up to d for pidfd to turn readable.
func exited(pidfd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, err := unix.Poll(fds, 100)
		if err == nil && n > 0 {
			return true
		}
	}
	return false
}

func TestSpawn(t *testing.T) {
	c := startHelper(t)
	extraR, extraW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer extraR.Close()
	pid, pidfd, out := run(t, c, "echo $$; echo extra >&3; exec sleep 60", extraW)
	extraW.Close()

	line := make([]byte, 64)
	n, err := out.Read(line)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(line[:n]))); got != pid {
		t.Errorf("child says its pid is %q, Spawn said %d", line[:n], pid)
	}
	if b := make([]byte, 6); func() bool { _, err := io.ReadFull(extraR, b); return err != nil || string(b) != "extra\n" }() {
		t.Errorf("fd 3 did not reach the child")
	}
	flags, err := unix.FcntlInt(uintptr(pidfd), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_NONBLOCK == 0 {
		t.Errorf("pidfd flags %#x, %v: want non-blocking", flags, err)
	}
	// Not ours: the helper is its parent.
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(st), fmt.Sprintf("PPid:\t%d\n", os.Getpid())) {
		t.Errorf("the child's parent is the test process, not the helper")
	}
	if exited(pidfd, 200*time.Millisecond) {
		t.Fatal("pidfd readable while the child runs")
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !exited(pidfd, 10*time.Second) {
		t.Fatal("pidfd not readable after the child was killed")
	}
	// The helper reaps it: no zombie stays.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d not reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSpawnConcurrent(t *testing.T) {
	c := startHelper(t)
	const n = 16
	var wg sync.WaitGroup
	pids := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid, pidfd, _ := run(t, c, "exit 0")
			pids[i] = pid
			if !exited(pidfd, 10*time.Second) {
				t.Errorf("child %d: pidfd never readable", pid)
			}
		}()
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, p := range pids {
		if p <= 0 || seen[p] {
			t.Errorf("pids %v: want %d distinct", pids, n)
			break
		}
		seen[p] = true
	}
}

func TestSpawnError(t *testing.T) {
	c := startHelper(t)
	_, _, err := c.Spawn(Request{Path: filepath.Join(t.TempDir(), "missing"), Args: []string{"x"}}, nil)
	if err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("Spawn of a missing binary: %v; want an error that is not ErrClosed", err)
	}
	// The helper serves on.
	_, pidfd, _ := run(t, c, "exit 0")
	if !exited(pidfd, 10*time.Second) {
		t.Fatal("no exit after an error")
	}
}

func TestHelperGone(t *testing.T) {
	c := startHelper(t)
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	_, _, err := c.Spawn(Request{Path: "/bin/true", Args: []string{"true"}}, nil)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Spawn after the helper died: %v; want ErrClosed", err)
	}
}

func TestCloseEndsHelper(t *testing.T) {
	c := startHelper(t)
	_, _, _ = run(t, c, "exit 0")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("helper still running 10 s after Close")
	}
	if _, _, err := c.Spawn(Request{Path: "/bin/true"}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Spawn after Close: %v; want ErrClosed", err)
	}
}
