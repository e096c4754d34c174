package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// dockerDefaultCapBnd is Docker's default capability set without NET_RAW
// and MKNOD (issue 11, finding 7): CHOWN, DAC_OVERRIDE, FOWNER, FSETID,
// KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, AUDIT_WRITE,
// SETFCAP.
const dockerDefaultCapBnd = "00000000a00405fb"

// TestSecurity attacks the isolation from inside sandboxes. Every subtest
// states one isolation claim and tries to break it.
func TestSecurity(t *testing.T) {
	d := newDaemon(t)
	securityAttacks(t, d, d.create(t, agentbox.SandboxSpec{}))
}

// TestSecurityGvisor runs the same attacks on a gvisor sandbox, asserting
// the gVisor equivalent where a claim is made differently there: its
// processes make their system calls to the sentry, so there is no seccomp
// filter of ours on them (the sentry is under runsc's own, on the host),
// the sentry's uid_map is its own, and user namespaces are the sentry's.
func TestSecurityGvisor(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	securityAttacks(t, d, d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"}))
}

// securityAttacks attacks sb of d from inside; what each claim looks like
// depends on sb's backend (Info().Backend).
func securityAttacks(t *testing.T, d *daemon, sb *agentbox.Sandbox) {
	gvisor := sb.Info().Backend == "gvisor"
	wantSeccomp := "2"
	if gvisor {
		wantSeccomp = "0"
	}

	t.Run("ProcessPosture", func(t *testing.T) {
		// Every exec'd process, and its children, is filtered, cannot gain
		// privileges and has a trimmed bounding set.
		for _, cmd := range []string{"cat /proc/self/status", "sh -c 'sh -c \"cat /proc/self/status\"'"} {
			status := mustRun(t, sb, cmd)
			fields := parseStatus(status)
			if fields["Seccomp"] != wantSeccomp {
				t.Errorf("%s: Seccomp = %q, want %s", cmd, fields["Seccomp"], wantSeccomp)
			}
			if fields["NoNewPrivs"] != "1" {
				t.Errorf("%s: NoNewPrivs = %q, want 1", cmd, fields["NoNewPrivs"])
			}
			if fields["CapBnd"] != dockerDefaultCapBnd {
				t.Errorf("%s: CapBnd = %q, want %s", cmd, fields["CapBnd"], dockerDefaultCapBnd)
			}
			if fields["CapEff"] != dockerDefaultCapBnd && fields["CapEff"] != "0000000000000000" {
				t.Errorf("%s: CapEff = %q, want within %s", cmd, fields["CapEff"], dockerDefaultCapBnd)
			}
		}
	})

	t.Run("NoSharedNamespaces", func(t *testing.T) {
		for _, ns := range []string{"mnt", "pid", "net", "uts", "ipc", "cgroup", "user"} {
			host, err := os.Readlink("/proc/self/ns/" + ns)
			if err != nil {
				t.Fatal(err)
			}
			inside := strings.TrimSpace(string(run(t, sb, "readlink /proc/self/ns/"+ns).Stdout))
			if gvisor && ns == "cgroup" && inside == "" {
				continue // the sentry has no cgroup namespaces: nothing shared
			}
			if inside == "" || inside == host {
				t.Errorf("namespace %s: inside %q, host %q: shared or unreadable", ns, inside, host)
			}
		}
	})

	t.Run("RootIsUnprivilegedOnHost", func(t *testing.T) {
		if gvisor {
			gvisorRootUnprivileged(t, d, sb)
			return
		}
		uidMap := strings.Fields(mustRun(t, sb, "cat /proc/self/uid_map"))
		if len(uidMap) != 3 || uidMap[0] != "0" || uidMap[1] == "0" {
			t.Fatalf("uid_map = %v, want 0 -> unprivileged host uid", uidMap)
		}
		hostUID, _ := strconv.Atoi(uidMap[1])
		if hostUID < 1000 {
			t.Fatalf("sandbox root maps to host uid %d, a system account", hostUID)
		}
		if id := strings.TrimSpace(mustRun(t, sb, "id -u")); id != "0" {
			t.Fatalf("id -u inside = %s, want 0", id)
		}
		// A file root creates inside is stored in the canonical range (the
		// owner of the upper dir itself), never under the sandbox's own
		// host uid: a process escaping the sandbox owns no file on disk.
		mustRun(t, sb, "echo x > /root/owned")
		upper := filepath.Join(d.dataDir, "sandboxes", sb.ID(), "upper")
		fi, err := os.Stat(filepath.Join(upper, "root", "owned"))
		if err != nil {
			t.Fatalf("stat upper file on host: %v", err)
		}
		ui, err := os.Stat(upper)
		if err != nil {
			t.Fatal(err)
		}
		if uid := statUID(fi); uid != statUID(ui) || uid == uint32(hostUID) || uid < 1000 {
			t.Fatalf("file created by sandbox root is owned by host uid %d, want the canonical %d (sandbox root is %d)", uid, statUID(ui), hostUID)
		}
	})

	t.Run("OnlyStdioFDs", func(t *testing.T) {
		// ls opens /proc/self/fd itself as fd 3; nothing else may be open.
		out := mustRun(t, sb, "ls /proc/self/fd")
		for _, fd := range strings.Fields(out) {
			if fd != "0" && fd != "1" && fd != "2" && fd != "3" {
				t.Errorf("exec'd process has fd %s open (fds: %s)", fd, strings.Join(strings.Fields(out), " "))
			}
		}
		// The shell's own descriptors, seen from a child ("; true" keeps
		// the shell from exec'ing ls in its place).
		out = mustRun(t, sb, "ls /proc/$$/fd; true")
		for _, fd := range strings.Fields(out) {
			if fd != "0" && fd != "1" && fd != "2" {
				t.Errorf("shell has fd %s open (fds: %s)", fd, strings.Join(strings.Fields(out), " "))
			}
		}
	})

	t.Run("CwdOutsideRootRefused", func(t *testing.T) {
		hostCanary := "/agentbox-host-canary-" + randHex(4)
		if err := os.Mkdir(hostCanary, 0o700); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(hostCanary)
		ctx := context.Background()
		for _, cwd := range []string{"relative/dir", "/does/not/exist", "/proc/self/fd/3", "/proc/self/fd/4", "/proc/1/fd/3", "/proc/self/cwd/../../.."} {
			res, err := sb.Run(ctx, "ls -a ../../../../../../..", agentbox.WithCwd(cwd))
			if err != nil {
				if !agentbox.IsInvalidArgument(err) && !agentbox.IsNotFound(err) {
					t.Errorf("cwd %q: error %v, want invalid argument", cwd, err)
				}
				continue
			}
			if strings.Contains(string(res.Stdout), filepath.Base(hostCanary)) {
				t.Errorf("cwd %q reached the host root: %s", cwd, res.Stdout)
			}
		}
	})

	t.Run("SymlinksDoNotReachHost", func(t *testing.T) {
		dir := t.TempDir()
		canary := filepath.Join(dir, "canary")
		secret := "host-secret-" + randHex(8)
		if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// The sandbox's own view: the canary path does not exist inside.
		if res := run(t, sb, "cat "+canary); res.ExitCode == 0 || strings.Contains(string(res.Stdout), secret) {
			t.Fatalf("host canary readable inside the sandbox: %s", res.Stdout)
		}
		// Final component, intermediate component, and a relative escape.
		mustRun(t, sb, "ln -sf "+canary+" /tmp/final && ln -sfn "+dir+" /tmp/inter && ln -sfn ../../../../../../.. /tmp/rel")
		for _, p := range []string{"/tmp/final", "/tmp/inter/canary", "/tmp/rel" + canary} {
			data, err := sb.ReadFile(ctx, p)
			if err == nil && bytes.Contains(data, []byte(secret)) {
				t.Errorf("files API read of %s returned the host canary", p)
			}
			if err := sb.WriteFile(ctx, p, []byte("pwned"), 0o644); err == nil {
				t.Logf("write to %s succeeded (inside the sandbox)", p)
			}
			if rc, err := sb.DownloadDir(ctx, filepath.Dir(p)); err == nil {
				b := new(bytes.Buffer)
				_, _ = b.ReadFrom(rc)
				rc.Close()
				if bytes.Contains(b.Bytes(), []byte(secret)) {
					t.Errorf("archive of %s contains the host canary", filepath.Dir(p))
				}
			}
		}
		got, err := os.ReadFile(canary)
		if err != nil || string(got) != secret {
			t.Fatalf("host canary changed: %q, %v", got, err)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Fatalf("host dir gained files through sandbox symlinks: %v", entries)
		}
		// What the writes created lives inside the sandbox, at the link's
		// target resolved in the sandbox's own root.
		if out := mustRun(t, sb, "cat "+canary); out != "pwned" {
			t.Fatalf("write through a sandbox symlink landed elsewhere: inside file has %q", out)
		}
	})

	t.Run("MinimalDev", func(t *testing.T) {
		want := map[string]bool{"null": true, "zero": true, "full": true, "random": true, "urandom": true, "tty": true, "ptmx": true, "pts": true, "shm": true,
			"fd": true, "stdin": true, "stdout": true, "stderr": true, "mqueue": true}
		if gvisor { // the sentry's own devices, none of the host's
			want["char"], want["fuse"], want["net"] = true, true, true
		}
		for _, name := range strings.Fields(mustRun(t, sb, "ls /dev")) {
			if !want[name] {
				t.Errorf("/dev/%s present in the sandbox", name)
			}
		}
		if res := run(t, sb, "mknod /tmp/mem c 1 1"); res.ExitCode == 0 {
			t.Fatal("mknod of a device succeeded")
		}
		if res := run(t, sb, "mknod /tmp/sda b 8 0"); res.ExitCode == 0 {
			t.Fatal("mknod of a block device succeeded")
		}
	})

	t.Run("HostBinaryNotWritableViaProcExe", func(t *testing.T) {
		bin := agentboxBin(t)
		before := fileHash(t, bin)
		res := run(t, sb, `for p in /proc/[0-9]*; do if (echo x >> $p/exe) 2>/dev/null; then echo WROTE $p $(readlink $p/exe); fi; done; echo done`)
		for _, line := range strings.Split(string(res.Stdout), "\n") {
			if !strings.HasPrefix(line, "WROTE") {
				continue
			}
			// The sentry has no ETXTBSY: a running program of the
			// sandbox's own root filesystem opens for writing there, as
			// any file of it does for its root. The runner is read-only.
			if f := strings.Fields(line); gvisor && len(f) == 3 && !strings.HasPrefix(f[2], "/.agentbox") {
				continue
			}
			t.Errorf("opened /proc/*/exe for writing: %s", line)
		}
		if after := fileHash(t, bin); after != before {
			t.Fatal("the agentbox binary on the host changed")
		}
		// PID 1's executable is the read-only runner copy, not the daemon's
		// (or, since the guest is not dumpable, not even visible).
		if res := run(t, sb, "readlink /proc/1/exe"); res.ExitCode == 0 && !strings.HasPrefix(string(res.Stdout), "/.agentbox/") {
			t.Errorf("/proc/1/exe -> %s, want the runner under /.agentbox", res.Stdout)
		}
	})

	t.Run("KernelInterfacesBlocked", func(t *testing.T) {
		cmds := []string{
			"unshare -m true", "unshare -n true",
			"mount -t tmpfs x /mnt", "mount --bind /tmp /mnt",
			"echo 1 > /proc/sys/kernel/panic",
			"echo b > /proc/sysrq-trigger",
		}
		if !gvisor { // under gVisor a user namespace is the sentry's, not the host kernel's
			cmds = append(cmds, "unshare -U true")
		}
		for _, cmd := range cmds {
			if res := run(t, sb, cmd); res.ExitCode == 0 {
				t.Errorf("%q succeeded inside the sandbox", cmd)
			}
		}
		for _, masked := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} {
			if out := mustRun(t, sb, "head -c 16 "+masked+" 2>/dev/null | wc -c; true"); strings.TrimSpace(out) != "0" {
				t.Errorf("%s is readable inside the sandbox (%s bytes)", masked, strings.TrimSpace(out))
			}
		}
		if out := mustRun(t, sb, "cat /proc/net/dev"); strings.Contains(out, "eth") || strings.Contains(out, "veth") || strings.Count(out, ":") != 1 {
			t.Errorf("network interfaces other than lo:\n%s", out)
		}
	})
}

// TestResourceBombsContained runs a fork bomb and a memory bomb and checks
// that a neighbour keeps answering and the bombs stay inside their limits.
func TestResourceBombsContained(t *testing.T) {
	d := newDaemon(t)
	neighbour := d.create(t, agentbox.SandboxSpec{})
	ctx := context.Background()

	t.Run("ForkBomb", func(t *testing.T) {
		sb := d.create(t, agentbox.SandboxSpec{Resources: apiResources(0, 0, 64)})
		res, err := sb.Run(ctx, `bomb() { bomb | bomb & }; bomb; sleep 3; echo done`, agentbox.WithTimeout(20*time.Second))
		if err != nil {
			t.Fatalf("fork bomb exec: %v", err)
		}
		_ = res
		if out := mustRun(t, neighbour, "echo alive"); strings.TrimSpace(out) != "alive" {
			t.Fatalf("neighbour answered %q", out)
		}
		n := countSandboxProcs(t, d, sb.ID())
		if n > 64 {
			t.Fatalf("sandbox has %d processes, pids.max is 64", n)
		}
	})

	t.Run("MemoryBomb", func(t *testing.T) {
		sb := d.create(t, agentbox.SandboxSpec{Resources: apiResources(0, 64<<20, 0)})
		res, err := sb.Run(ctx, `dd if=/dev/zero bs=1M count=512 | sort > /dev/null; echo survived`, agentbox.WithTimeout(60*time.Second))
		if err != nil {
			t.Fatalf("memory bomb exec: %v", err)
		}
		if strings.Contains(string(res.Stdout), "survived") && res.ExitCode == 0 && !strings.Contains(string(res.Stderr), "Killed") {
			// sort's exit status is what the shell reports; check it was killed.
			t.Logf("stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
		}
		oom := mustRun(t, sb, "echo ok")
		if strings.TrimSpace(oom) != "ok" {
			t.Fatalf("sandbox did not survive its own OOM kill: %q", oom)
		}
		if events := memoryOOMKills(t, sb.ID()); events == 0 {
			t.Fatalf("no OOM kill recorded in the sandbox's memory cgroup; stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
		}
		if out := mustRun(t, neighbour, "echo alive"); strings.TrimSpace(out) != "alive" {
			t.Fatalf("neighbour answered %q", out)
		}
	})
}

func parseStatus(s string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func fileHash(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// gvisorRootUnprivileged: under gVisor the sandbox's root is root of the
// sentry's kernel, which runs on the host as an unprivileged user (runsc
// maps it to nobody in a user namespace of its own), and what root writes
// is stored in the canonical range that owns the upper dir, as under
// native.
func gvisorRootUnprivileged(t *testing.T, d *daemon, sb *agentbox.Sandbox) {
	if id := strings.TrimSpace(mustRun(t, sb, "id -u")); id != "0" {
		t.Fatalf("id -u inside = %s, want 0", id)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	found := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("runsc-sandbox")) || !bytes.Contains(b, []byte(sb.ID())) {
			continue
		}
		found++
		st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		uids := strings.Fields(parseStatus(string(st))["Uid"])
		if len(uids) == 0 || uids[0] == "0" || uids[1] == "0" {
			t.Errorf("the sentry %s runs as host uid %v", filepath.Dir(p), uids)
		}
	}
	if found == 0 {
		t.Errorf("no runsc-sandbox process of %s found on the host", sb.ID())
	}
	mustRun(t, sb, "echo x > /root/owned")
	upper := filepath.Join(d.dataDir, "sandboxes", sb.ID(), "upper")
	fi, err := os.Stat(filepath.Join(upper, "root", "owned"))
	if err != nil {
		t.Fatalf("stat upper file on host: %v", err)
	}
	ui, err := os.Stat(upper)
	if err != nil {
		t.Fatal(err)
	}
	if uid := statUID(fi); uid != statUID(ui) || uid < 1000 {
		t.Fatalf("file created by sandbox root is owned by host uid %d, want the canonical %d", uid, statUID(ui))
	}
}
