package native

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/native/nsinit"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

func securitySandbox(t *testing.T, res runtime.Resources) (runtime.Spec, runtime.Sandbox) {
	t.Helper()
	testutil.Short(t)
	f := fixture(t)
	spec := runtimetest.NewSpec(t, runtimetest.NewID("sec"), f.Layer, f.RunnerDir)
	spec.Resources = res
	return spec, runtimetest.Create(t, newTestBackend(t), spec)
}

func statusFields(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// TestSecurityPosture checks what every sandbox process gets, from inside.
func TestSecurityPosture(t *testing.T) {
	spec, _ := securitySandbox(t, runtime.Resources{})
	sock := spec.SocketPath
	run := func(cmd string) (string, int) { return runtimetest.MustExec(t, sock, cmd) }
	wantCap := fmt.Sprintf("%016x", nsinit.DefaultCapMask())

	t.Run("ForkedProcess", func(t *testing.T) {
		out, _ := run("cat /proc/self/status")
		st := statusFields(out)
		want := map[string]string{"Seccomp": "2", "NoNewPrivs": "1", "CapBnd": wantCap, "CapEff": wantCap, "CapPrm": wantCap, "CapInh": "0000000000000000", "CapAmb": "0000000000000000"}
		for k, v := range want {
			if st[k] != v {
				t.Errorf("%s = %q, want %q", k, st[k], v)
			}
		}
		// The guest's own environment (GOMAXPROCS=1) is not theirs.
		if env, _ := run("env"); strings.Contains(env, "GOMAXPROCS") {
			t.Errorf("a sandbox process inherited the guest's environment:\n%s", env)
		}
	})
	t.Run("GuestThreads", func(t *testing.T) {
		out, _ := run("for s in /proc/1/task/*/status; do grep -E '^(Seccomp|NoNewPrivs|CapBnd|CapEff):' $s; done")
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			n++
			switch k {
			case "Seccomp":
				if v != "2" {
					t.Errorf("guest thread Seccomp %s", v)
				}
			case "NoNewPrivs":
				if v != "1" {
					t.Errorf("guest thread NoNewPrivs %s", v)
				}
			default:
				if v != wantCap {
					t.Errorf("guest thread %s %s", k, v)
				}
			}
		}
		if n < 8 { // at least two threads of four lines
			t.Errorf("only %d status lines for the guest's threads:\n%s", n, out)
		}
	})
	t.Run("Namespaces", func(t *testing.T) {
		for _, ns := range []string{"mnt", "pid", "net", "uts", "ipc", "user", "cgroup"} {
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
	t.Run("UIDMap", func(t *testing.T) {
		out, _ := run("cat /proc/self/uid_map /proc/self/gid_map; id -u")
		if f := strings.Fields(out); len(f) != 7 || f[0] != "0" || f[1] != "100000" || f[2] != "65536" || f[4] != "100000" || f[6] != "0" {
			t.Errorf("maps/id = %q", out)
		}
	})
	mustFail := map[string]string{
		"mknod":           "mknod /tmp/x c 1 3",
		"unshareUser":     "unshare -U true",
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
	for name, cmd := range mustFail {
		t.Run("Denied/"+name, func(t *testing.T) {
			if out, code := run(cmd); code == 0 {
				t.Errorf("%q succeeded: %q", cmd, out)
			}
		})
	}
	t.Run("ProcMasked", func(t *testing.T) {
		out, _ := run("(test -e /proc/kcore && wc -c < /proc/kcore) || echo 0; cat /proc/keys /proc/timer_list | wc -c; (ls -A /proc/acpi; ls -A /proc/scsi) 2>/dev/null | wc -l")
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
		want := []string{".", "..", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
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

// TestForkBombContained: pids.max holds a fork bomb, and the sandbox is
// still destroyable afterwards.
func TestForkBombContained(t *testing.T) {
	spec, sb := securitySandbox(t, runtime.Resources{PidsMax: 64})
	_, _, _ = runtimetest.Exec(spec.SocketPath, "(f(){ f | f & }; f) >/dev/null 2>&1 &", 10*time.Second)
	time.Sleep(2 * time.Second)
	st, err := sb.(runtime.StatsReader).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pids > 64 {
		t.Errorf("pids = %d over pids.max 64", st.Pids)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after fork bomb: %v", err)
	}
	runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, sb, spec)
}

// TestMemoryHogOOMKilled: a process over the memory limit is OOM-killed
// (no swap to escape to).
func TestMemoryHogOOMKilled(t *testing.T) {
	spec, sb := securitySandbox(t, runtime.Resources{MemoryBytes: 32 << 20})
	_, code := runtimetest.MustExec(t, spec.SocketPath, "dd if=/dev/zero of=/dev/null bs=128M count=1")
	if code != 128+9 {
		t.Errorf("memory hog exit = %d, want 137 (SIGKILL)", code)
	}
	st, err := sb.(runtime.StatsReader).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d", st.OOMKills)
	}
	if out, _ := runtimetest.MustExec(t, spec.SocketPath, "echo alive"); out != "alive\n" {
		t.Errorf("guest after OOM: %q", out)
	}
}

// TestDestroyKillsEscapees: double-forked session leaders die with the
// sandbox, and nothing of it (process, cgroup, mount) remains on the host.
func TestDestroyKillsEscapees(t *testing.T) {
	spec, sb := securitySandbox(t, runtime.Resources{})
	userns, _ := runtimetest.MustExec(t, spec.SocketPath, "readlink /proc/self/ns/user")
	userns = strings.TrimSpace(userns)
	runtimetest.MustExec(t, spec.SocketPath, "setsid sh -c 'sleep 1000 &' >/dev/null 2>&1 </dev/null; setsid sh -c 'sleep 1001 &' >/dev/null 2>&1 </dev/null")
	if n := len(processesInUserNS(t, userns)); n < 3 {
		t.Fatalf("expected guest and two sleeps in user ns %s, found %d", userns, n)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, sb, spec)
	if left := processesInUserNS(t, userns); len(left) > 0 {
		t.Errorf("processes survived destroy: %v", left)
	}
}

var pidDir = regexp.MustCompile(`^[0-9]+$`)

func processesInUserNS(t *testing.T, ns string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !pidDir.MatchString(e.Name()) {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns/user")); err == nil && l == ns {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestPlantedSymlinksRefused: an upper dir kept from an earlier run may hold
// symlinks the sandbox planted at mount targets; setup must refuse them
// rather than mount over host paths.
func TestPlantedSymlinksRefused(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newTestBackend(t)
	for _, target := range []string{"proc", "dev", ".agentbox", "sys"} {
		t.Run(target, func(t *testing.T) {
			spec := runtimetest.NewSpec(t, runtimetest.NewID("sym"), f.Layer, f.RunnerDir)
			link := filepath.Join(spec.UpperDir, target)
			if err := os.Symlink("/etc", link); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(link, int(runtimetest.TestIDMap.HostID), int(runtimetest.TestIDMap.HostID)); err != nil {
				t.Fatal(err)
			}
			sb, err := b.Create(context.Background(), spec)
			if err == nil {
				sb.Destroy(context.Background())
				t.Fatalf("Create with planted symlink %s succeeded", target)
			}
			if !strings.Contains(err.Error(), "openat2") {
				t.Errorf("error does not come from the safe lookup: %v", err)
			}
			runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, nil, spec)
		})
	}
}

// TestSecuritySuite runs the security suite every backend runs
// (runtimetest.RunSecurity) with native's posture: a seccomp filter, the
// default capabilities, and a /dev bound from a fixed list.
func TestSecuritySuite(t *testing.T) {
	testutil.Short(t)
	runtimetest.RunSecurity(t, fixture(t), runtimetest.Posture{
		Seccomp: "2",
		CapMask: fmt.Sprintf("%016x", nsinit.DefaultCapMask()),
		Dev:     []string{".", "..", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"},
	})
}
