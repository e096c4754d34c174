package native

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

// TestNativePosture checks, from inside, what only native's sandboxes
// have: the guest's own threads under the same filter and capabilities as
// the processes it forks, a cgroup namespace, and the mapped id range.
// What every backend's sandboxes get is TestSecuritySuite's
// (runtimetest.RunSecurity).
func TestNativePosture(t *testing.T) {
	spec, _ := securitySandbox(t, runtime.Resources{})
	sock := spec.SocketPath
	run := func(cmd string) (string, int) { return runtimetest.MustExec(t, sock, cmd) }
	wantCap := fmt.Sprintf("%016x", nsinit.DefaultCapMask())

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
	// The setsid'd shells exit as soon as they have forked their sleeps,
	// which may not have started yet.
	for deadline := time.Now().Add(10 * time.Second); len(processesInUserNS(t, userns)) < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("expected guest and two sleeps in user ns %s, found %d", userns, len(processesInUserNS(t, userns)))
		}
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
