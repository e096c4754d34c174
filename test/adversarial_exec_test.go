package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Finding 7 of issue 11: the boundaries around one exec. Each test attacks
// from inside the sandbox (another exec, root inside) or from the
// command's own descendants.

// leftovers returns the ps lines of processes whose command line contains
// marker, as seen from a fresh exec in sb, waiting up to a few seconds for
// them to go (a kill is asynchronous).
func leftovers(t *testing.T, sb *agentbox.Sandbox, marker string) string {
	t.Helper()
	var out string
	for deadline := time.Now().Add(3 * time.Second); ; {
		out = strings.TrimSpace(mustRun(t, sb, "ps -o pid,ppid,args | grep '[ ]"+marker+"' || true"))
		if out == "" || time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// appears waits up to a few seconds for a process whose command line
// contains marker to show up in sb.
func appears(t *testing.T, sb *agentbox.Sandbox, marker string) bool {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if strings.TrimSpace(mustRun(t, sb, "ps -o pid,ppid,args | grep '[ ]"+marker+"' || true")) != "" {
			return true
		}
	}
	return false
}

// TestAdversarialExecTimeoutKillsDescendants: a per-exec timeout kills
// every process the exec started, however it detached itself (new session,
// double fork to PID 1, new process group), and so does an explicit
// SIGKILL of a background exec.
func TestAdversarialExecTimeoutKillsDescendants(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	cases := []struct {
		name, marker, cmd string
	}{
		{"setsid", "sleep 1001", "setsid sleep 1001 & sleep 100"},
		{"double-fork-setsid-pgrp", "sleep 1002",
			`(setsid sh -c 'set -m; (sleep 1002 &) ; true' &) ; sleep 100`},
		{"daemonised-new-pgrp", "sleep 1003",
			`(cd / && setsid sh -c 'trap "" HUP TERM; exec sleep 1003' </dev/null >/dev/null 2>&1 &) ; exec sleep 100`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, err := sb.Start(ctx, api.ExecRequest{Command: c.cmd, TimeoutSeconds: 3})
			if err != nil {
				t.Fatal(err)
			}
			if !appears(t, sb, c.marker) {
				t.Fatalf("the exec's detached process %q never started", c.marker)
			}
			res, err := p.Attach(ctx, false, agentbox.Streams{})
			if err != nil {
				t.Fatal(err)
			}
			if !res.TimedOut {
				t.Fatalf("exec did not time out: %+v", res)
			}
			if left := leftovers(t, sb, c.marker); left != "" {
				t.Fatalf("after the timeout, processes of the exec still run:\n%s", left)
			}
		})
	}
	t.Run("explicit-kill-of-background", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := sb.Start(ctx, api.ExecRequest{Command: "setsid sleep 1004 & (setsid sleep 1005 &) ; sleep 100"})
		if err != nil {
			t.Fatal(err)
		}
		if !appears(t, sb, "sleep 1005") {
			t.Fatal("the background exec's detached child never started")
		}
		if err := p.Signal(ctx, "KILL"); err != nil {
			t.Fatal(err)
		}
		if left := leftovers(t, sb, "sleep 100[45]"); left != "" {
			t.Fatalf("after SIGKILL of the exec, its processes still run:\n%s", left)
		}
	})
	// The guest holds its cgroup tree open; no exec may start in it,
	// whether its cwd names one of the guest's descriptors or is a
	// symlink planted to one (root inside may plant one at /root, the
	// default cwd).
	t.Run("cwd-cannot-reach-cgroup-tree", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for fd := 3; fd <= 12; fd++ {
			link := fmt.Sprintf("/tmp/cw%d", fd)
			mustRun(t, sb, fmt.Sprintf("ln -sfn /proc/self/fd/%d %s", fd, link))
			for _, cwd := range []string{fmt.Sprintf("/proc/self/fd/%d", fd), link} {
				res, err := sb.Run(ctx, "ls; ls ..", agentbox.WithCwd(cwd))
				if err != nil {
					continue // refused
				}
				if out := string(res.Stdout); strings.Contains(out, "cgroup.") {
					t.Errorf("an exec with cwd %s started in a cgroup directory:\n%s", cwd, out)
				}
			}
		}
		mustRun(t, sb, "mv /root /root.real && ln -s /proc/self/fd/4 /root")
		defer mustRun(t, sb, "rm /root && mv /root.real /root", agentbox.WithCwd("/"))
		if res, err := sb.Run(ctx, "ls; ls .."); err == nil && strings.Contains(string(res.Stdout), "cgroup.") {
			t.Errorf("an exec with a planted home directory started in a cgroup directory:\n%s", res.Stdout)
		}
	})
	// Other execs are untouched by one exec's timeout.
	t.Run("neighbour-survives", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 1006"}); err != nil {
			t.Fatal(err)
		}
		run(t, sb, "setsid sleep 1007 & sleep 100", agentbox.WithTimeout(time.Second))
		if !appears(t, sb, "sleep 1006") {
			t.Fatal("a neighbouring exec was killed by another exec's timeout")
		}
		if left := leftovers(t, sb, "sleep 1007"); left != "" {
			t.Fatalf("after the timeout, processes of the exec still run:\n%s", left)
		}
	})
}

// buildHelper compiles a static helper from testdata and copies it into sb
// at /usr/local/bin/<name>.
func buildHelper(t *testing.T, sb *agentbox.Sandbox, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(goBin, "build", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, b)
	}
	b, err = os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dst := "/usr/local/bin/" + name
	if err := sb.WriteFile(ctx, dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestAdversarialExecSecretEnv: a process started with a per-command secret
// runs beside a second exec as the same user (root inside the sandbox),
// which tries /proc/<pid>/environ, /proc/<pid>/mem at the environment's
// address, process_vm_readv, ptrace attach and a core dump provoked after
// raising the victim's core limit. None may yield the secret.
func TestAdversarialExecSecretEnv(t *testing.T) {
	d, _ := secretDaemon(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	value := "vv" + randHex(16) + "Kq"
	if _, err := d.client.SetSecret(ctx, "victim", []byte(value)); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, agentbox.SandboxSpec{})
	spy := buildHelper(t, sb, "procspy")
	mustRun(t, sb, "mkdir -p /tmp/victim && chmod 777 /tmp/victim")

	for _, user := range []string{"", "nobody"} {
		name := "as-root"
		if user != "" {
			name = "as-" + user
		}
		t.Run(name, func(t *testing.T) {
			mustRun(t, sb, "rm -f /tmp/victim/*")
			req := api.ExecRequest{
				Command: "sleep 30", Cwd: "/tmp/victim", User: user,
				Secrets: []api.ExecSecret{{Name: "victim", Env: "VICTIM_TOKEN"}},
			}
			p, err := sb.Start(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Signal(context.Background(), "KILL") }()
			res := run(t, sb, fmt.Sprintf("%s %d VICTIM_TOKEN /tmp/victim", spy, p.Pid()), agentbox.WithUser(user))
			out := string(res.Stdout) + string(res.Stderr)
			t.Logf("attacker (user %q) output:\n%s", user, out)
			if strings.Contains(out, rot13(value)) || strings.Contains(out, "LEAK") {
				t.Fatalf("another exec obtained the secret of process %d:\n%s", p.Pid(), out)
			}
		})
	}
	// A private exec (another secret's holder) is no better placed.
	t.Run("as-private-neighbour", func(t *testing.T) {
		if _, err := d.client.SetSecret(ctx, "other", []byte("o"+randHex(8))); err != nil {
			t.Fatal(err)
		}
		p, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 30", Cwd: "/tmp/victim",
			Secrets: []api.ExecSecret{{Name: "victim", Env: "VICTIM_TOKEN"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Signal(context.Background(), "KILL") }()
		res := run(t, sb, fmt.Sprintf("%s %d VICTIM_TOKEN /tmp/victim", spy, p.Pid()), agentbox.WithSecret("other", "OTHER"))
		out := string(res.Stdout) + string(res.Stderr)
		if strings.Contains(out, rot13(value)) || strings.Contains(out, "LEAK") {
			t.Fatalf("another private exec obtained the secret of process %d:\n%s", p.Pid(), out)
		}
	})
	// Private without a secret: an environment passed with env.
	t.Run("explicit-private", func(t *testing.T) {
		plain := "pe" + randHex(8)
		p, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 30", Private: true,
			Env: map[string]string{"VICTIM_TOKEN": plain}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Signal(context.Background(), "KILL") }()
		res := run(t, sb, fmt.Sprintf("%s %d VICTIM_TOKEN /nonexistent", spy, p.Pid()))
		if out := string(res.Stdout); strings.Contains(out, rot13(plain)) || strings.Contains(out, "LEAK") {
			t.Fatalf("another exec read a private process's environment:\n%s", out)
		}
		// And the SDK option sets it.
		res = run(t, sb, "sleep 5 & "+spy+" $! VICTIM_TOKEN /nonexistent; kill $!", agentbox.WithPrivate(), agentbox.WithEnv(map[string]string{"VICTIM_TOKEN": plain}))
		if !strings.Contains(string(res.Stdout), "LEAK environ: "+rot13(plain)) {
			t.Fatalf("a private process's own child could not read its sibling:\n%s%s", res.Stdout, res.Stderr)
		}
	})
	// A process's own descendants still read it (the domain is inherited).
	t.Run("own-child-reads", func(t *testing.T) {
		res := run(t, sb, "sleep 30 & sleep 0.2; "+spy+" $! VICTIM_TOKEN /nonexistent; kill $!",
			agentbox.WithSecret("victim", "VICTIM_TOKEN"))
		if !strings.Contains(string(res.Stdout), "LEAK environ: ") {
			t.Fatalf("a private process's own child could not read its sibling's environment:\n%s%s", res.Stdout, res.Stderr)
		}
	})
	// The attack itself works: against a process without a secret, the
	// same spy reads the environment (so a pass above is not a broken spy).
	t.Run("control", func(t *testing.T) {
		p, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 30", Cwd: "/tmp/victim",
			Env: map[string]string{"VICTIM_TOKEN": "plain" + strconv.Itoa(os.Getpid())}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Signal(context.Background(), "KILL") }()
		out := mustRun(t, sb, fmt.Sprintf("%s %d VICTIM_TOKEN /nonexistent", spy, p.Pid()))
		if !strings.Contains(out, "LEAK environ: "+rot13("plain"+strconv.Itoa(os.Getpid()))) {
			t.Fatalf("the spy could not read an ordinary neighbour's environment:\n%s", out)
		}
	})
}

// TestAdversarialExecCaps: the bounding set of a sandbox process holds
// neither CAP_MKNOD (27) nor CAP_NET_RAW (13), and ICMP echo still works
// through an unprivileged datagram ICMP socket.
func TestAdversarialExecCaps(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	out := mustRun(t, sb, "grep CapBnd /proc/self/status")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("CapBnd line %q", out)
	}
	bnd, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		bit  uint
	}{{"CAP_MKNOD", 27}, {"CAP_NET_RAW", 13}} {
		if bnd&(1<<c.bit) != 0 {
			t.Errorf("bounding set %#x holds %s", bnd, c.name)
		}
	}
	if res := run(t, sb, "mknod /tmp/null c 1 3"); res.ExitCode == 0 {
		t.Errorf("mknod of a character device succeeded")
	}
	// clone3 is allowed by the seccomp filter (the guest starts execs in
	// their cgroups with it) but no namespace can be made with it.
	ns := buildHelper(t, sb, "nsclone")
	out = string(run(t, sb, ns).Stdout)
	t.Logf("nsclone:\n%s", out)
	if strings.Contains(out, "escaped") || strings.Count(out, "refused") != 3 {
		t.Errorf("a sandbox process created a namespace:\n%s", out)
	}
	echo := buildHelper(t, sb, "icmpecho")
	for _, user := range []string{"", "nobody"} {
		res := run(t, sb, echo, agentbox.WithUser(user))
		out := string(res.Stdout) + string(res.Stderr)
		if res.ExitCode != 0 || !strings.Contains(out, "pong") {
			t.Errorf("datagram ICMP echo to 127.0.0.1 as user %q failed (exit %d):\n%s", user, res.ExitCode, out)
		}
		if strings.Contains(out, "raw socket: opened") {
			t.Errorf("user %q opened a raw socket:\n%s", user, out)
		}
	}
}
