package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

// gvisorPosture is what a gVisor sandbox's processes get: no seccomp
// filter of ours (the sentry serves their system calls; it is itself under
// runsc's filter on the host), the same capability set as native's, and
// the sentry's own /dev: native's devices plus the sentry's fuse and
// net/tun (devices of its kernel, not the host's) and the mount point of
// the guest socket's directory, closed to the sandbox.
var gvisorPosture = runtimetest.Posture{
	Seccomp: "0",
	CapMask: "00000000a00405fb",
	Dev: []string{".", "..", ".agentbox-run", "char", "fd", "full", "fuse", "net", "null", "ptmx", "pts",
		"random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"},
}

func TestSecurity(t *testing.T) {
	testutil.Short(t)
	runtimetest.RunSecurity(t, fixture(t), gvisorPosture)
}

// TestGuestSocketDirClosed: once Create returns, the directory through
// which the guest's socket reached the host holds nothing and takes
// nothing from the sandbox, even as its root: the sandbox cannot plant a
// socket, a file or a symlink the host would find there.
func TestGuestSocketDirClosed(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newBackendTB(t)
	spec := runtimetest.NewSpec(t, runtimetest.NewID("udir"), f.Layer, f.RunnerDir)
	runtimetest.Create(t, b, spec)
	// Opening it up first (the sentry answers a chmod of a directory
	// whose owner it does not map without changing it on the host).
	runtimetest.MustExec(t, spec.SocketPath, "chmod 777 /dev/.agentbox-run; chown 0:0 /dev/.agentbox-run")
	for _, cmd := range []string{
		"touch /dev/.agentbox-run/x", "ln -s /etc /dev/.agentbox-run/l", "mkdir /dev/.agentbox-run/d",
		"nc -lU /dev/.agentbox-run/s & sleep 0.2; test -S /dev/.agentbox-run/s",
	} {
		if out, code := runtimetest.MustExec(t, spec.SocketPath, cmd); code == 0 {
			t.Errorf("%q succeeded inside: %q", cmd, out)
		}
	}
	udir := filepath.Join(b.bundleDir(spec.ID), bundleSocket)
	ents, err := os.ReadDir(udir)
	if err != nil || len(ents) != 0 {
		t.Errorf("socket dir on the host: %v, %v; want empty", ents, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(udir, &st); err != nil || st.Uid != 0 || st.Gid != 0 || st.Mode&0o7777 != 0o555 {
		t.Errorf("socket dir on the host: uid %d gid %d mode %o, %v; want host root's, 0555", st.Uid, st.Gid, st.Mode&0o7777, err)
	}
	if fi, err := os.Lstat(spec.SocketPath); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("guest socket %s: %v, %v", spec.SocketPath, fi, err)
	}
}

// TestPlantedSymlinks: an upper dir kept from an earlier run may hold
// symlinks the sandbox planted at mount targets. Under gVisor the mounts
// are made inside the sentry, whose root is the sandbox's own: whatever
// runsc does with such a symlink, no host path is mounted over or shown,
// and /tmp (bound from the overlay by the host, so checked there) is not
// bound through a symlink.
func TestPlantedSymlinks(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newBackendTB(t)
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"proc", "dev", ".agentbox", "sys", "tmp"} {
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
			if err != nil {
				t.Logf("refused: %v", err)
				runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, nil, spec)
				return
			}
			// The host's /etc is not what the sandbox sees at /etc.
			out, _ := runtimetest.MustExec(t, spec.SocketPath, "cat /etc/hostname 2>/dev/null; ls /etc | wc -l")
			host, _ := os.ReadFile("/etc/hostname")
			if len(host) > 0 && strings.HasPrefix(out, string(host)) {
				t.Errorf("the sandbox sees the host's /etc through the planted %s: %q", target, out)
			}
			if err := sb.Destroy(context.Background()); err != nil {
				t.Fatal(err)
			}
			runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, sb, spec)
		})
	}
	after, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// Nothing mounted on the host's /etc, nor left of the bundles (other
	// processes on the host mount and unmount what they like meanwhile).
	if n, m := mountsAt(string(before), "/etc"), mountsAt(string(after), "/etc"); m != n {
		t.Errorf("mounts on the host's /etc: %d before, %d after", n, m)
	}
	if strings.Contains(string(after), filepath.Join(rootDir, "b")+"/") {
		t.Errorf("bundle mounts left on the host:\n%s", after)
	}
}

// TestMemoryHog: a sandbox over its memory limit does not take the host
// with it. Under gVisor the limit is the host cgroup of the sentry and
// its gofer: the sentry sizes its memory to it, and what goes over is
// killed on the host; the sandbox can be destroyed afterwards, leaving
// nothing.
func TestMemoryHog(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newBackendTB(t)
	spec := runtimetest.NewSpec(t, runtimetest.NewID("oom"), f.Layer, f.RunnerDir)
	spec.Resources = runtime.Resources{MemoryBytes: 128 << 20}
	sb := runtimetest.Create(t, b, spec)
	out, code, err := runtimetest.Exec(spec.SocketPath, "dd if=/dev/zero of=/dev/null bs=512M count=1; echo rc=$?", time.Minute)
	t.Logf("memory hog: %q, exit %d, %v", out, code, err)
	if err == nil && strings.Contains(out, "rc=0") {
		t.Errorf("a 512 MiB buffer fitted under a 128 MiB limit: %q", out)
	}
	// Unlike native, where the host kernel kills the process over the
	// limit and the guest lives on, the host's OOM killer here picks a
	// process of the sandbox's host cgroup: the sentry, with every task
	// of the sandbox. Either way the limit held and it was the kernel's
	// OOM kill.
	st, serr := sb.(runtime.StatsReader).Stats(context.Background())
	if serr == nil && st.OOMKills < 1 {
		t.Errorf("stats after the hog: %+v; want an OOM kill", st)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy after the memory hog: %v", err)
	}
	runtimetest.AssertGone(t, runtimetest.Fixture{Leftovers: leftovers}, sb, spec)
}

// mountsAt counts the mounts of mountinfo whose mount point is dir.
func mountsAt(mountinfo, dir string) int {
	n := 0
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}
