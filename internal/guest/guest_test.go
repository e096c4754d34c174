package guest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestMain(m *testing.M) {
	// Orphans of the processes the guest starts come back to this process,
	// as they would to PID 1 of a sandbox, so the reaper can be tested.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// startGuest runs guest.Serve in-process on a socket in a temp dir. Only
// one runs at a time (its reaper owns every child of the test process).
func startGuest(t testing.TB, opts guest.Options) (*client.Client, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "guest.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if opts.Version == "" {
		opts.Version = "test-1"
	}
	go func() { done <- guest.Serve(ctx, ln, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return client.New(sock), sock
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type result struct {
	pid            int
	stdout, stderr string
	exit           api.ExecEvent
}

// collect reads a stream to its end.
func collect(t testing.TB, s *client.Stream) result {
	t.Helper()
	defer s.Close()
	var r result
	var out, errb bytes.Buffer
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		switch ev.Type {
		case api.EventStarted:
			r.pid = ev.Pid
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventExit, api.EventError:
			r.exit = ev
		}
	}
	r.stdout, r.stderr = out.String(), errb.String()
	if r.exit.Type == "" {
		t.Fatal("stream ended without exit event")
	}
	return r
}

func run(t testing.TB, c *client.Client, req api.ExecRequest) result {
	t.Helper()
	s, err := c.Exec(tctx(t), req)
	if err != nil {
		t.Fatalf("Exec %+v: %v", req, err)
	}
	return collect(t, s)
}

func exitCode(t testing.TB, r result) int {
	t.Helper()
	if r.exit.Type != api.EventExit || r.exit.ExitCode == nil {
		t.Fatalf("want exit event, got %+v", r.exit)
	}
	return *r.exit.ExitCode
}

func TestVersion(t *testing.T) {
	c, _ := startGuest(t, guest.Options{Version: "v9.9"})
	v, err := c.Version(tctx(t))
	if err != nil || v != "v9.9" {
		t.Fatalf("Version = %q, %v", v, err)
	}
}

func TestVersionOfAskedPerCall(t *testing.T) {
	var asked atomic.Int32
	c, _ := startGuest(t, guest.Options{Version: "ignored", VersionOf: func() string {
		return fmt.Sprintf("v%d", asked.Add(1))
	}})
	if n := asked.Load(); n != 0 {
		t.Fatalf("VersionOf asked %d times before any version operation", n)
	}
	for _, want := range []string{"v1", "v2"} {
		if v, err := c.Version(tctx(t)); err != nil || v != want {
			t.Fatalf("Version = %q, %v; want %q", v, err, want)
		}
	}
}

func TestExecOutputAndExitCode(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	r := run(t, c, api.ExecRequest{Command: "echo out; echo err >&2; exit 3"})
	if r.stdout != "out\n" || r.stderr != "err\n" || exitCode(t, r) != 3 || r.pid <= 0 {
		t.Fatalf("got %+v", r)
	}
	r = run(t, c, api.ExecRequest{Cmd: []string{"echo", "a b"}, Env: map[string]string{"X": "1"}})
	if r.stdout != "a b\n" || exitCode(t, r) != 0 {
		t.Fatalf("got %+v", r)
	}
	r = run(t, c, api.ExecRequest{Command: `echo "$X $PATH $HOME"; pwd`, Env: map[string]string{"X": "y"}, Cwd: "/tmp"})
	if want := "y " + guest.DefaultPath + " "; !strings.HasPrefix(r.stdout, want) || !strings.HasSuffix(r.stdout, "\n/tmp\n") {
		t.Fatalf("env/cwd: %q", r.stdout)
	}
}

func TestExecErrors(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	for _, tc := range []struct {
		req  api.ExecRequest
		want error
	}{
		{api.ExecRequest{}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Cmd: []string{"true"}, Command: "true"}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Command: "true", Cwd: "relative"}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Command: "true", Cwd: "/nonexistent-dir"}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Command: "true", Cwd: "/etc/passwd"}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Cmd: []string{"no-such-binary-xyz"}}, errdefs.ErrNotFound},
		{api.ExecRequest{Command: "true", User: "no-such-user-xyz"}, errdefs.ErrInvalidArgument},
		{api.ExecRequest{Command: "true", Env: map[string]string{"A=B": "c"}}, errdefs.ErrInvalidArgument},
	} {
		_, err := c.Exec(ctx, tc.req)
		if !errors.Is(err, tc.want) {
			t.Errorf("Exec %+v: err %v, want %v", tc.req, err, tc.want)
		}
	}
}

func TestExecStdin(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	r := run(t, c, api.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("hello\n")})
	if r.stdout != "hello\n" || exitCode(t, r) != 0 {
		t.Fatalf("got %+v", r)
	}
	// No stdin: EOF at once.
	if r := run(t, c, api.ExecRequest{Cmd: []string{"cat"}}); r.stdout != "" || exitCode(t, r) != 0 {
		t.Fatalf("got %+v", r)
	}
	// Open stdin on the stream.
	s, err := c.Exec(tctx(t), api.ExecRequest{Command: "cat; echo done", StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	in := s.Stdin()
	if _, err := in.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout != "abcdone\n" {
		t.Fatalf("got %+v", r)
	}
	// Background with stdin written by later calls.
	ctx := tctx(t)
	p, err := c.Start(ctx, api.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, p.Pid, strings.NewReader("one "), false); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, p.Pid, strings.NewReader("two"), true); err != nil {
		t.Fatal(err)
	}
	s, err = c.Attach(ctx, p.Pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout != "one two" || exitCode(t, r) != 0 {
		t.Fatalf("got %+v", r)
	}
	if err := c.WriteStdin(ctx, 999999, strings.NewReader("x"), true); !errdefs.IsNotFound(err) {
		t.Fatalf("stdin to unknown pid: %v", err)
	}
}

func TestExecTTY(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	r := run(t, c, api.ExecRequest{Command: "tty; stty size; echo err >&2; echo $TERM", TTY: &api.TTY{Rows: 24, Cols: 80}})
	if !strings.Contains(r.stdout, "/dev/pts/") || !strings.Contains(r.stdout, "24 80") ||
		!strings.Contains(r.stdout, "err") || !strings.Contains(r.stdout, "xterm") || r.stderr != "" {
		t.Fatalf("tty output %q stderr %q", r.stdout, r.stderr)
	}
	ctx := tctx(t)
	s, err := c.Exec(ctx, api.ExecRequest{Command: "read x; stty size", TTY: &api.TTY{Rows: 10, Cols: 20}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, s.Pid(), api.TTY{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stdin().Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); !strings.Contains(r.stdout, "40 100") {
		t.Fatalf("after resize: %q", r.stdout)
	}
	// Resize of a process without a TTY.
	p, err := c.Start(ctx, api.ExecRequest{Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, p.Pid, api.TTY{Rows: 1, Cols: 1}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("resize without tty: %v", err)
	}
}

func TestExecTimeout(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	start := time.Now()
	// The background child is in the same process group and dies too.
	r := run(t, c, api.ExecRequest{Command: "sleep 30 & sleep 30", TimeoutSeconds: 0.2})
	if time.Since(start) > 5*time.Second {
		t.Fatalf("timeout took %v", time.Since(start))
	}
	if exitCode(t, r) != -1 || r.exit.Signal != "KILL" || !r.exit.TimedOut {
		t.Fatalf("got %+v", r.exit)
	}
}

func TestSignal(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	for _, sig := range []struct{ send, want string }{{"TERM", "TERM"}, {"9", "KILL"}, {"SIGINT", "INT"}} {
		p, err := c.Start(ctx, api.ExecRequest{Cmd: []string{"sleep", "30"}})
		if err != nil {
			t.Fatal(err)
		}
		if !p.Running {
			t.Fatalf("started process not running: %+v", p)
		}
		if err := c.Signal(ctx, p.Pid, sig.send); err != nil {
			t.Fatal(err)
		}
		s, err := c.Attach(ctx, p.Pid, false)
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, s)
		if exitCode(t, r) != -1 || r.exit.Signal != sig.want || r.exit.TimedOut {
			t.Fatalf("signal %s: %+v", sig.send, r.exit)
		}
		if err := c.Signal(ctx, p.Pid, "TERM"); !errdefs.IsConflict(err) {
			t.Fatalf("signal after exit: %v", err)
		}
	}
	if err := c.Signal(ctx, 1, "BOGUS"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bogus signal: %v", err)
	}
	// Exit code of a shell whose child was signalled.
	r := run(t, c, api.ExecRequest{Command: "kill -KILL $$"})
	if exitCode(t, r) != -1 || r.exit.Signal != "KILL" {
		t.Fatalf("self-kill: %+v", r.exit)
	}
}

func TestBackgroundReattachReplay(t *testing.T) {
	c, _ := startGuest(t, guest.Options{MaxOutputBuffer: 1000})
	ctx := tctx(t)
	p, err := c.Start(ctx, api.ExecRequest{Command: "echo one; sleep 0.3; echo two", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	// Live attach with replay gets the past and the future.
	s, err := c.Attach(ctx, p.Pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); r.stdout != "one\ntwo\n" || exitCode(t, r) != 0 {
		t.Fatalf("attach: %+v", r)
	}
	// After the exit: replay and exit again; without replay only the exit.
	for _, replay := range []bool{true, false} {
		s, err := c.Attach(ctx, p.Pid, replay)
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		if replay {
			want = "one\ntwo\n"
		}
		if r := collect(t, s); r.stdout != want || exitCode(t, r) != 0 {
			t.Fatalf("re-attach replay=%v: %+v", replay, r)
		}
	}
	ps, err := c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, q := range ps {
		if q.Pid == p.Pid {
			found = true
			if q.Running || q.ExitCode == nil || *q.ExitCode != 0 || q.ExitedAt == nil {
				t.Fatalf("process record %+v", q)
			}
		}
	}
	if !found {
		t.Fatalf("pid %d not in %+v", p.Pid, ps)
	}
	// The replay buffer keeps the newest bytes.
	p, err = c.Start(ctx, api.ExecRequest{Command: "seq 1 2000"})
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, c, p.Pid)
	s, err = c.Attach(ctx, p.Pid, true)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if len(r.stdout) > 1000 || !strings.HasSuffix(r.stdout, "1999\n2000\n") {
		t.Fatalf("replay of %d bytes ends %q", len(r.stdout), r.stdout[max(0, len(r.stdout)-20):])
	}
	if _, err := c.Attach(ctx, 999999, true); !errdefs.IsNotFound(err) {
		t.Fatalf("attach unknown pid: %v", err)
	}
}

func TestConcurrentExecs(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := c.Exec(ctx, api.ExecRequest{Command: fmt.Sprintf("echo %d; exit %d", i, i%7)})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			var out bytes.Buffer
			for {
				ev, err := s.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					errs <- err
					return
				}
				out.Write(ev.Data)
				if ev.Type == api.EventExit && *ev.ExitCode != i%7 {
					errs <- fmt.Errorf("exec %d: exit %d", i, *ev.ExitCode)
				}
			}
			if out.String() != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: output %q", i, out.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestOnlyStdioInherited(t *testing.T) {
	// A descriptor inherited without O_CLOEXEC must not leak either.
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	c, _ := startGuest(t, guest.Options{})
	for _, tty := range []*api.TTY{nil, {Rows: 5, Cols: 5}} {
		r := run(t, c, api.ExecRequest{Cmd: []string{"ls", "-1", "/proc/self/fd"}, TTY: tty})
		if got := strings.Fields(r.stdout); strings.Join(got, " ") != "0 1 2 3" {
			t.Fatalf("tty=%v: fds of exec'd process: %q", tty != nil, r.stdout)
		}
	}
}

func TestUserSwitch(t *testing.T) {
	testutil.RequiresRoot(t)
	c, _ := startGuest(t, guest.Options{})
	r := run(t, c, api.ExecRequest{Command: "id -u; id -g; echo $HOME $USER", User: "nobody"})
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || lines[0] != "65534" || !strings.Contains(lines[2], "nobody") {
		t.Fatalf("as nobody: %q", r.stdout)
	}
	r = run(t, c, api.ExecRequest{Command: "id -u; id -g; id -G", User: "1234:2345"})
	if got := strings.Fields(r.stdout); len(got) != 3 || got[0] != "1234" || got[1] != "2345" || got[2] != "2345" {
		t.Fatalf("as 1234:2345: %q", r.stdout)
	}
}

// children returns the pids of this process's children in state Z.
func zombieChildren(t *testing.T) []int {
	t.Helper()
	me := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		rest := s[strings.LastIndexByte(s, ')')+2:]
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(me) && f[0] == "Z" {
			out = append(out, pid)
		}
	}
	return out
}

func TestReapsOrphans(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	for range 5 {
		r := run(t, c, api.ExecRequest{Command: "sleep 0.1 & exit 0"})
		if exitCode(t, r) != 0 {
			t.Fatal(r)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		z := zombieChildren(t)
		if len(z) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombie children remain: %v", z)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func BenchmarkExecTrue(b *testing.B) {
	c, _ := startGuest(b, guest.Options{})
	ctx := context.Background()
	for b.Loop() {
		s, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, err := s.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		s.Close()
	}
}

// BenchmarkBareExecTrue is the baseline for BenchmarkExecTrue. It must not
// run while a guest's reaper is active (it would steal the exit status).
func BenchmarkBareExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func waitExited(t *testing.T, c *client.Client, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ps, err := c.Processes(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Pid == pid && !p.Running {
				time.Sleep(100 * time.Millisecond) // the output drains after the exit
				return
			}
		}
	}
	t.Fatalf("process %d did not exit", pid)
}
