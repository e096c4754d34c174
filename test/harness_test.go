// Package test holds the integration and security suites. They drive the
// real agentbox binary: a daemon started as a subprocess on a private socket
// and data dir, reached through the public Go SDK, exactly as users do.
//
// They need root (namespaces, cgroups); CI runs them as root. Set
// AGENTBOX_BIN to a prebuilt static binary, or the suite builds one.
package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/testutil"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes the binary agentboxBin built, which outlives every test.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" && os.Getenv("AGENTBOX_BIN") == "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// agentboxBin returns the path of a static agentbox binary: $AGENTBOX_BIN,
// or one built into a temp dir (removed by TestMain).
func agentboxBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("AGENTBOX_BIN"); p != "" {
			binPath, binErr = filepath.Abs(p)
			return
		}
		dir, err := os.MkdirTemp("", "agentbox-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "agentbox")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/agentbox/agentbox/cmd/agentbox")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("agentbox binary: %v", binErr)
	}
	return binPath
}

// daemon is an `agentbox serve` subprocess.
type daemon struct {
	t       testing.TB
	dir     string // short: holds the socket
	dataDir string
	socket  string
	logPath string
	// parent is the daemon's cgroup parent: $AGENTBOX_CGROUP_PARENT when
	// set at its start, else the one derived from its data dir.
	parent string
	cmd    *exec.Cmd
	client *agentbox.Client
	args   []string // extra `agentbox serve` flags
	wrap   []string // command the daemon is started under (e.g. prlimit ...)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newDaemon starts a daemon on a fresh data dir; it is stopped (sandboxes
// deleted, data dir removed) when t ends.
func newDaemon(t testing.TB) *daemon {
	t.Helper()
	return newDaemonWith(t)
}

// newDaemonWith is newDaemon with extra `agentbox serve` flags.
func newDaemonWith(t testing.TB, args ...string) *daemon {
	t.Helper()
	return newDaemonWrapped(t, nil, args...)
}

// newDaemonWrapped is newDaemonWith with the daemon started under wrap, a
// command that execs its arguments (e.g. "prlimit --nofile=1024:1024"),
// so the daemon itself is the process the harness waits for.
func newDaemonWrapped(t testing.TB, wrap []string, args ...string) *daemon {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := filepath.Join("/tmp", "abx-"+randHex(4))
	// 0711: the sandboxes' mapped uid range must be able to traverse it
	// (overlay dirs and the runner are mounted from inside the userns).
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &daemon{
		t:       t,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		socket:  filepath.Join(dir, "run", "agentbox.sock"),
		logPath: filepath.Join(dir, "daemon.log"),
		args:    args,
		wrap:    wrap,
	}
	d.start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if d.cmd != nil && d.client != nil {
			if sbs, err := d.client.List(ctx, nil); err == nil {
				for _, sb := range sbs {
					_ = sb.Delete(ctx)
				}
			}
		}
		d.stop(syscall.SIGTERM)
		// Every sandbox of this daemon is gone: no process of its still
		// has a mount from its data dir (pooled, half-created or
		// forgotten sandboxes included). Prespawned guests of a daemon
		// killed with SIGKILL exit on their own once they see their config
		// pipe closed, and exiting processes take a moment to be reaped:
		// allow a few seconds. Processes of other daemons on the host
		// (other tests, a CI neighbour) are not this daemon's to answer
		// for; the test TestAdversarialTwoDaemonsZygotesPinNoMounts is
		// what keeps them from holding this one's mounts.
		pids := d.processesUsingDataDir()
		for deadline := time.Now().Add(10 * time.Second); len(pids) > 0 && time.Now().Before(deadline); pids = d.processesUsingDataDir() {
			time.Sleep(50 * time.Millisecond)
		}
		if len(pids) > 0 {
			var desc []string
			for _, pid := range pids {
				cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
				stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
				desc = append(desc, fmt.Sprintf("%d %q (stat %.60s)", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), stat))
			}
			t.Errorf("processes still use %s after all sandboxes were deleted and the daemon stopped: %v", d.dataDir, desc)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// Nor does the host keep a mount under its data dir (the
		// sandboxes dir's nosuid,nodev bind, a sandbox's disk): those
		// are left only by a daemon that did not clean up after itself.
		if mps := hostMountsUnder(d.dataDir); len(mps) > 0 {
			t.Errorf("host mounts left under %s after all sandboxes were deleted and the daemon stopped: %v", d.dataDir, mps)
			for i := len(mps) - 1; i >= 0; i-- {
				_ = syscall.Unmount(mps[i], syscall.MNT_DETACH)
			}
		}
		// Nor is any cgroup left under its parent (its sandboxes' and
		// prespawned guests'); the parent itself, empty, goes too.
		left := d.cgroupsLeft()
		for deadline := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = d.cgroupsLeft() {
			time.Sleep(50 * time.Millisecond)
		}
		if len(left) > 0 {
			t.Errorf("cgroups left under the daemon's parent %s after all sandboxes were deleted and the daemon stopped: %v", d.parent, left)
		}
		for _, root := range hierarchyRoots() {
			_ = syscall.Rmdir(filepath.Join(root, d.parent))
		}
		if t.Failed() {
			if b, err := os.ReadFile(d.logPath); err == nil {
				t.Logf("daemon log:\n%s", tail(string(b), 60))
			}
		}
		_ = os.RemoveAll(dir)
	})
	return d
}

// processesUsing returns the pids whose mount table references path (a
// sandbox guest's runner mount names its data dir), on the whole host,
// leaving out the processes that share this test's (the host's) mount
// namespace: a mount the daemon made on the host under path shows in
// every host process's table, and those processes are not sandboxes'
// (killing them would kill the test and its neighbours).
// hostMountsUnder answers for such mounts.
func processesUsing(path string) []int {
	self, _ := os.Readlink("/proc/self/ns/mnt")
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "mnt")); err != nil || ns == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "mountinfo"))
		if err == nil && strings.Contains(string(b), path+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// processesUsingDataDir is processesUsing of the daemon's data dir,
// leaving out the processes of other daemons: those in a cgroup under
// another daemon's parent.
func (d *daemon) processesUsingDataDir() []int {
	var out []int
	for _, pid := range processesUsing(d.dataDir) {
		if p := cgroupParentOf(procCgroup(strconv.Itoa(pid))); p != "" && p != d.parent && isDaemonParent(p) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// cgroupParentOf is the first component of a cgroup path ("/p/id" -> "p").
func cgroupParentOf(cg string) string {
	p, _, _ := strings.Cut(strings.TrimPrefix(cg, "/"), "/")
	return p
}

// isDaemonParent reports whether the top-level cgroup p holds a daemon's
// sandboxes: one a daemon has owned (it made a lock file for it; probing
// the lock itself could make a daemon starting meanwhile fail), or the
// legacy shared one.
func isDaemonParent(p string) bool {
	if p == config.LegacyCgroupParent {
		return true
	}
	_, err := os.Stat(filepath.Join("/run/lock/agentbox", "cgroup-"+strings.ReplaceAll(p, "/", "_")+".lock"))
	return err == nil
}

// cgroupsLeft lists the cgroups under the daemon's parent, in every
// hierarchy.
func (d *daemon) cgroupsLeft() []string {
	return cgroupChildren(d.parent)
}

// procCgroup is the cgroup of pid in the freezer hierarchy (v1) or the
// unified one (v2).
func procCgroup(pid string) string {
	f, err := os.Open(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		return ""
	}
	defer f.Close()
	unified := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "freezer" {
				return parts[2]
			}
		}
		if parts[1] == "" {
			unified = parts[2]
		}
	}
	return unified
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// start launches the daemon process and waits until its API answers.
func (d *daemon) start() {
	d.t.Helper()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"serve", "--data-dir", d.dataDir, "--socket", d.socket, "--log-level", "debug"}, d.args...)
	argv := append(append(append([]string(nil), d.wrap...), agentboxBin(d.t)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Keep the test daemon's secrets key in its own dir, not in /etc.
	if os.Getenv("AGENTBOX_SECRETS_KEY_FILE") == "" {
		cmd.Env = append(os.Environ(), "AGENTBOX_SECRETS_KEY_FILE="+filepath.Join(d.dir, "secrets.key"))
	}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.cmd = cmd
	if d.parent = os.Getenv(config.EnvCgroupParent); d.parent == "" {
		d.parent = config.DerivedCgroupParent(d.dataDir) // /tmp/abx-*: no symlinks
	}
	c, err := agentbox.New(agentbox.WithHost("unix://" + d.socket))
	if err != nil {
		d.t.Fatal(err)
	}
	d.client = c
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(d.logPath)
			d.t.Fatalf("daemon did not become healthy: %v\n%s", err, tail(string(b), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends sig to the daemon and waits for it to exit.
func (d *daemon) stop(sig syscall.Signal) {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
	d.cmd = nil
}

// restart stops the daemon with sig (SIGKILL for a crash) and starts a new
// one on the same data dir.
func (d *daemon) restart(sig syscall.Signal) {
	d.t.Helper()
	d.stop(sig)
	d.start()
}

// create makes a busybox sandbox deleted at the end of the test.
func (d *daemon) create(t testing.TB, spec agentbox.SandboxSpec) *agentbox.Sandbox {
	t.Helper()
	if spec.Template == "" {
		spec.Template = "busybox"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := d.client.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Delete(ctx); err != nil && !agentbox.IsNotFound(err) {
			t.Errorf("delete sandbox %s: %v", sb.ID(), err)
		}
	})
	return sb
}

// run runs a shell command and fails the test unless it could be run.
func run(t testing.TB, sb *agentbox.Sandbox, command string, opts ...agentbox.ExecOption) *agentbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Run(ctx, command, opts...)
	if err != nil {
		t.Fatalf("run %q: %v", command, err)
	}
	return res
}

// mustRun runs a shell command and fails the test unless it exits 0.
func mustRun(t testing.TB, sb *agentbox.Sandbox, command string, opts ...agentbox.ExecOption) string {
	t.Helper()
	res := run(t, sb, command, opts...)
	if res.ExitCode != 0 {
		t.Fatalf("run %q: exit %d\nstdout: %s\nstderr: %s", command, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// rawRequest sends an HTTP request to the daemon's unix socket and returns
// the status and body.
func (d *daemon) rawRequest(t testing.TB, method, path string, body []byte) (int, []byte) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "unix", d.socket)
		},
	}, Timeout: 30 * time.Second}
	req, err := http.NewRequest(method, "http://agentbox"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// loopbackAddr returns a free loopback TCP address (host:port) for a
// daemon's --tcp listener.
func loopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// tcpDaemon starts a daemon that also listens on loopback TCP with one
// admin API key (in a keys file with a comment line, as operators write
// them), and returns it with the address and the key.
func tcpDaemon(t *testing.T) (*daemon, string, string) {
	t.Helper()
	addr := loopbackAddr(t)
	keyFile := filepath.Join(t.TempDir(), "keys")
	key := "test-key-" + randHex(16)
	if err := os.WriteFile(keyFile, []byte("# test keys\n"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return newDaemonWith(t, "--tcp", addr, "--api-keys-file", keyFile), addr, key
}

// sandboxCgroupFile is the path of file in the cgroup of sandbox id in the
// v1 hierarchy named hierarchy, or in the unified one when hierarchy is
// "": under whichever parent holds it (the daemon's own,
// agentbox-<hash of its data dir>, or the legacy agentbox). Sandbox ids
// are unique, so the glob matches one cgroup; "" when none.
func sandboxCgroupFile(hierarchy, id, file string) string {
	m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", hierarchy, "agentbox*", id, file))
	if len(m) == 0 {
		return filepath.Join("/sys/fs/cgroup", hierarchy, "agentbox", id, file)
	}
	return m[0]
}
