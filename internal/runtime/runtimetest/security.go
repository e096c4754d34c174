package runtimetest

import (
	"context"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

// Posture is what every process of a backend's sandboxes gets, as seen
// from inside; RunSecurity checks it, and what is the same for every
// backend. Where a check means something else on a backend with its own
// kernel (runtime.CapOwnKernel: the sandbox's system calls never reach the
// host's), the suite asserts that backend's equivalent rather than
// skipping it.
type Posture struct {
	// Seccomp is the Seccomp field of /proc/self/status: "2" (a filter)
	// under native; "0" under gVisor, whose sentry serves every system
	// call itself (the sentry is under runsc's own filter, on the host,
	// out of the sandbox's sight).
	Seccomp string
	// CapMask is the bounding, effective and permitted set, as 16 hex
	// digits.
	CapMask string
	// Dev is `ls -a /dev`, sorted.
	Dev []string
}

// RunSecurity runs the security suite: attacks and inspections from inside
// a sandbox of f's backend, and resource bombs that must stay contained.
// It needs root.
func RunSecurity(t *testing.T, f Fixture, p Posture) {
	testutil.RequiresRoot(t)
	t.Run("Posture", func(t *testing.T) { testPosture(t, f, p) })
	t.Run("ForkBombContained", func(t *testing.T) { testForkBomb(t, f) })
	t.Run("DestroyKillsEscapees", func(t *testing.T) { testEscapees(t, f) })
}

func statusFields(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

func testPosture(t *testing.T, f Fixture, p Posture) {
	b := f.NewBackend(t)
	ownKernel := b.Capabilities().Has(runtime.CapOwnKernel)
	spec := NewSpec(t, NewID("sec"), f.Layer, f.RunnerDir)
	Create(t, b, spec)
	run := func(cmd string) (string, int) { return MustExec(t, spec.SocketPath, cmd) }

	t.Run("ForkedProcess", func(t *testing.T) {
		out, _ := run("cat /proc/self/status")
		st := statusFields(out)
		want := map[string]string{"Seccomp": p.Seccomp, "NoNewPrivs": "1", "CapBnd": p.CapMask, "CapEff": p.CapMask,
			"CapPrm": p.CapMask, "CapInh": "0000000000000000", "CapAmb": "0000000000000000"}
		for k, v := range want {
			if st[k] != v {
				t.Errorf("%s = %q, want %q", k, st[k], v)
			}
		}
		if env, _ := run("env"); strings.Contains(env, "GOMAXPROCS") {
			t.Errorf("a sandbox process inherited the guest's environment:\n%s", env)
		}
	})
	t.Run("Kernel", func(t *testing.T) {
		host, err := os.ReadFile("/proc/version")
		if err != nil {
			t.Fatal(err)
		}
		in, _ := run("cat /proc/version")
		if same := in == string(host); same == ownKernel {
			t.Errorf("own kernel %v, but the sandbox's /proc/version %q vs the host's %q", ownKernel, in, host)
		}
	})
	t.Run("Namespaces", func(t *testing.T) {
		for _, ns := range []string{"mnt", "pid", "net", "uts", "ipc", "user"} {
			host, err := os.Readlink("/proc/self/ns/" + ns)
			if err != nil {
				t.Fatal(err)
			}
			in, _ := run("readlink /proc/self/ns/" + ns)
			if strings.TrimSpace(in) == host || !strings.HasPrefix(in, ns+":[") {
				t.Errorf("namespace %s: sandbox %q, host %q", ns, in, host)
			}
		}
	})
	mustFail := map[string]string{
		"mknod":           "mknod /tmp/x c 1 3",
		"unshareMount":    "unshare -m true",
		"unshareNet":      "unshare -n true",
		"mount":           "mkdir -p /mnt && mount -t tmpfs x /mnt",
		"remountRoot":     "mount -o remount,rw /",
		"procSysWrite":    "echo evil > /proc/sys/kernel/hostname",
		"procSysrq":       "echo h > /proc/sysrq-trigger",
		"guestExeWrite":   "echo x >> /proc/1/exe",
		"guestMem":        "cat /proc/1/mem",
		"guestEnviron":    "cat /proc/1/environ",
		"runnerReadOnly":  "touch /.agentbox/x",
		"sysReadOnly":     "touch /sys/x",
		"chrootEscape":    "chroot /proc/1/root true",
		"settime":         "date -s 2000-01-01 >/dev/null 2>&1; test $(date +%Y) = 2000",
		"hostnameChange":  "hostname evil && test \"$(cat /proc/sys/kernel/hostname)\" = evil",
		"devMemAbsent":    "test -e /dev/mem",
		"kmsgAbsent":      "test -e /dev/kmsg",
		"cgroupfsAbsent":  "ls /sys/fs/cgroup/memory",
		"nsenterHostInit": "nsenter -t 1 -m true",
	}
	if !ownKernel {
		// A user namespace of the host kernel is attack surface; one of
		// the sentry's is not the host's (gVisor allows it inside).
		mustFail["unshareUser"] = "unshare -U true"
	}
	for name, cmd := range mustFail {
		t.Run("Denied/"+name, func(t *testing.T) {
			if out, code := run(cmd); code == 0 {
				t.Errorf("%q succeeded: %q", cmd, out)
			}
		})
	}
	if ownKernel {
		t.Run("UserNamespaceIsTheSandboxKernels", func(t *testing.T) {
			// Allowed, but the namespace is the sandbox kernel's: no host
			// process has it.
			out, code := run("unshare -U readlink /proc/self/ns/user")
			if code != 0 {
				return // refused is as good
			}
			if host := userNamespacesOnHost(t); host[strings.TrimSpace(out)] {
				t.Errorf("the sandbox's new user namespace %s is one of the host kernel's", out)
			}
		})
	}
	t.Run("ProcMasked", func(t *testing.T) {
		out, _ := run("(test -e /proc/kcore && wc -c < /proc/kcore) || echo 0; cat /proc/keys /proc/timer_list 2>/dev/null | wc -c; (ls -A /proc/acpi; ls -A /proc/scsi) 2>/dev/null | wc -l")
		if f := strings.Fields(out); len(f) != 3 || f[0] != "0" || f[1] != "0" || f[2] != "0" {
			t.Errorf("masked /proc paths show content: %q", out)
		}
	})
	t.Run("LoopbackOnly", func(t *testing.T) {
		out, _ := run("cat /proc/net/dev")
		var ifs []string
		for _, line := range strings.Split(out, "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
				ifs = append(ifs, strings.TrimSpace(name))
			}
		}
		if len(ifs) != 1 || ifs[0] != "lo" {
			t.Errorf("interfaces %v:\n%s", ifs, out)
		}
		if out, code := run("ip link"); code != 0 || strings.Count(out, "mtu") != 1 || !strings.Contains(out, "lo:") || !strings.Contains(out, "UP") {
			t.Errorf("ip link: %d %q", code, out)
		}
	})
	t.Run("MinimalDev", func(t *testing.T) {
		out, _ := run("ls -a /dev")
		got := strings.Fields(out)
		sort.Strings(got)
		want := append([]string(nil), p.Dev...)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("/dev = %v, want %v", got, want)
		}
		if out, code := run("echo hi > /dev/null && head -c 4 /dev/urandom | wc -c"); code != 0 || strings.TrimSpace(out) != "4" {
			t.Errorf("devices unusable: %d %q", code, out)
		}
	})
	t.Run("NoLeakedFDs", func(t *testing.T) {
		out, _ := run("ls -l /proc/self/fd/")
		if strings.Contains(out, "socket:") || strings.Contains(out, "guest.log") || strings.Contains(out, spec.StateDir) {
			t.Errorf("sandbox process inherited host fds:\n%s", out)
		}
	})
	t.Run("NoHostPaths", func(t *testing.T) {
		out, _ := run("ls / ; ls /.agentbox")
		if strings.Contains(out, "tmp/Test") || !strings.Contains(out, "agentbox") {
			t.Errorf("unexpected root listing:\n%s", out)
		}
		if out, code := run("cat " + spec.SocketPath); code == 0 {
			t.Errorf("host socket path visible: %q", out)
		}
	})
}

// userNamespacesOnHost are the user namespaces of every host process.
func userNamespacesOnHost(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/user"); err == nil {
			out[l] = true
		}
	}
	return out
}

// testForkBomb: a fork bomb under a pids limit of 64 stays under it on the
// host, and the sandbox can be destroyed afterwards, leaving nothing.
func testForkBomb(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	if !b.Capabilities().Has(runtime.CapCgroups) || !b.Capabilities().Has(runtime.CapStats) {
		t.Skip("the backend enforces no limits")
	}
	spec := NewSpec(t, NewID("bomb"), f.Layer, f.RunnerDir)
	spec.Resources = runtime.Resources{PidsMax: 64}
	sb := Create(t, b, spec)
	_, _, _ = Exec(spec.SocketPath, "(f(){ f | f & }; f) >/dev/null 2>&1 &", 10*time.Second)
	time.Sleep(2 * time.Second)
	if st, err := sb.(runtime.StatsReader).Stats(context.Background()); err == nil && st.Pids > 64 {
		t.Errorf("pids = %d over pids.max 64", st.Pids)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after fork bomb: %v", err)
	}
	AssertGone(t, f, sb, spec)
}

// testEscapees: double-forked session leaders die with the sandbox, and
// nothing of it remains on the host.
func testEscapees(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	spec := NewSpec(t, NewID("esc"), f.Layer, f.RunnerDir)
	sb := Create(t, b, spec)
	MustExec(t, spec.SocketPath, "setsid sh -c 'sleep 1000 &' >/dev/null 2>&1 </dev/null; setsid sh -c 'sleep 1001 &' >/dev/null 2>&1 </dev/null")
	// Each setsid'd shell backgrounds its sleep and exits at once: the
	// child may not have exec'd sleep yet when the command returns.
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ = MustExec(t, spec.SocketPath, "pidof sleep | wc -w")
		if strings.TrimSpace(out) == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleeps running: %q", out)
		}
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	AssertGone(t, f, sb, spec)
}
