package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// freeBytes is the free space of the filesystem holding path, for
// unprivileged users (what a sandbox's writes would consume).
func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// loopsOf lists the loop devices backed by files under dir.
func loopsOf(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		t.Fatalf("losetup -a: %v: %s", err, out)
	}
	var hits []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, dir) {
			hits = append(hits, l)
		}
	}
	return hits
}

// mountsUnder lists the host mounts at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var hits []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir) {
			hits = append(hits, f[4])
		}
	}
	return hits
}

// eventually polls cond for up to 5 s (a loop device clears itself
// asynchronously once its filesystem's last mount is gone).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 5*time.Second, what, cond)
}

func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after %s", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fillDisk writes zeros in sb until its disk quota of quota bytes stops
// it: the write must end in ENOSPC after about quota bytes, and the
// filesystem holding hostDir must have lost no more than quota plus slack
// (what other writers on it may add meanwhile).
func fillDisk(t *testing.T, sb *agentbox.Sandbox, quota int64, hostDir string, slack int64) {
	t.Helper()
	before := freeBytes(t, hostDir)
	res := run(t, sb, "dd if=/dev/zero of=/root/fill bs=1M count=256 2>&1; echo rc=$?; sync")
	if out := string(res.Stdout); !strings.Contains(out, "No space left on device") || !strings.Contains(out, "rc=1") {
		t.Fatalf("filling the disk of %s: %s", sb.ID(), out)
	}
	size, _ := strconv.ParseInt(strings.TrimSpace(mustRun(t, sb, "wc -c < /root/fill")), 10, 64)
	if size < quota/2 || size > quota {
		t.Fatalf("%s wrote %d bytes before ENOSPC, want about %d", sb.ID(), size, quota)
	}
	if used := before - freeBytes(t, hostDir); used > quota+slack {
		t.Fatalf("the host lost %d bytes to %s, its quota is %d", used, sb.ID(), quota)
	}
}

// fillInodes removes /root/fill and creates files in sb until its inode
// quota (inodes) stops it: fewer than inodes, but some, must be made.
func fillInodes(t *testing.T, sb *agentbox.Sandbox, inodes int) {
	t.Helper()
	res := run(t, sb, "rm /root/fill; mkdir /root/many && cd /root/many && i=0; while [ $i -lt 3000 ]; do touch f$i 2>/dev/null || break; i=$((i+1)); done; echo $i")
	if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); n <= 0 || n >= inodes {
		t.Fatalf("created %d files with a %d-inode quota", n, inodes)
	}
}

// deleteAllDisksGone deletes sbs and checks that no quota mount, loop
// device or disk image of d is left.
func deleteAllDisksGone(t *testing.T, d *daemon, sbs ...*agentbox.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := sb.Delete(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "no quota mounts after delete", func() bool {
		return len(mountsUnder(t, filepath.Join(d.dataDir, "sandboxes")+"/")) == 0
	})
	eventually(t, "no loop devices after delete", func() bool { return len(loopsOf(t, d.dataDir)) == 0 })
	// Sandboxes' images; disks/pool holds the ones made in advance while
	// the daemon runs.
	if imgs, _ := filepath.Glob(filepath.Join(d.dataDir, "disks", "*.img")); len(imgs) != 0 {
		t.Fatalf("images left: %v", imgs)
	}
}

// A sandbox filling its disk quota gets ENOSPC inside; the host loses no
// more than the quota; a neighbour keeps writing; the quota filesystem and
// its loop device are gone after hibernate (remounted on wake, files kept)
// and after delete.
func TestLimitsDiskQuota(t *testing.T) {
	d := newDaemon(t)
	switch m := agentboxInfo(t, d).DiskQuota; m {
	case api.DiskQuotaLoopExt4:
	case api.DiskQuotaXFSProject:
		testutil.NotApplicable(t, fmt.Sprintf("%s is on XFS with prjquota: disk quotas are %s here (TestLimitsDiskQuotaXFSProject)", d.dataDir, m))
	default:
		t.Fatalf("agentbox info: disk_quota %q, want %s", m, api.DiskQuotaLoopExt4)
	}
	const quota = 64 << 20
	full := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: quota, DiskInodes: 2048}})
	neighbour := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: quota}})
	if len(mountsUnder(t, d.dataDir)) < 2 {
		t.Fatalf("no quota mounts under %s: %v", d.dataDir, mountsUnder(t, d.dataDir))
	}

	// Other processes on the host write too: allow 32 MiB of noise.
	fillDisk(t, full, quota, d.dataDir, 32<<20)
	// Inodes are capped too.
	fillInodes(t, full, 2048)
	// The full sandbox and its neighbour still write.
	mustRun(t, neighbour, "dd if=/dev/zero of=/root/ok bs=1M count=16 2>/dev/null && echo written > /root/ok2")
	mustRun(t, full, "rm -rf /root/many && echo again > /root/again")

	info, err := d.client.Get(context.Background(), full.ID())
	if err != nil {
		t.Fatal(err)
	}
	if du := info.Info().Disk; du == nil || du.TotalBytes > quota || du.TotalBytes < quota/2 || du.TotalInodes > 2048 {
		t.Fatalf("inspect disk = %+v", du)
	}

	// Hibernate unmounts it (nothing resident); a call wakes it with its
	// files.
	ctx := context.Background()
	if err := full.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(d.dataDir, "sandboxes", full.ID())
	eventually(t, "quota fs unmounted on hibernate", func() bool {
		for _, m := range mountsUnder(t, dir) {
			if m == dir {
				return false
			}
		}
		return true
	})
	if got := mustRun(t, full, "cat /root/again"); got != "again\n" {
		t.Fatalf("after wake: %q", got)
	}

	// Delete: no mount, loop device or image is left.
	deleteAllDisksGone(t, d, full, neighbour)
}

// A fork of a disk-capped sandbox has a cap of its own: it sees its
// parent's files, gets ENOSPC once it has written its own quota, the host
// loses no more than that, the parent keeps writing, and the fork's
// filesystem is unmounted on hibernate (files kept) and gone on delete.
func TestLimitsDiskQuotaFork(t *testing.T) {
	d := newDaemon(t)
	if m := agentboxInfo(t, d).DiskQuota; m != api.DiskQuotaLoopExt4 && m != api.DiskQuotaXFSProject {
		t.Fatalf("agentbox info: disk_quota %q, want a method", m)
	}
	ctx := context.Background()
	const quota = 64 << 20
	parent := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: quota, DiskInodes: 4096}})
	mustRun(t, parent, "dd if=/dev/zero of=/root/base bs=1M count=8 2>/dev/null && echo base > /root/name")
	forks, err := parent.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	fork, other := forks[0], forks[1]

	if got := mustRun(t, fork, "cat /root/name"); got != "base\n" {
		t.Fatalf("fork sees %q, want the parent's file", got)
	}
	info, err := d.client.Get(ctx, fork.ID())
	if err != nil {
		t.Fatal(err)
	}
	if du := info.Info().Disk; du == nil || du.TotalBytes > quota || du.TotalBytes < quota/2 {
		t.Fatalf("fork's inspect disk = %+v, want a total of about %d", du, quota)
	}
	fillDisk(t, fork, quota, d.dataDir, 32<<20)
	// The parent and the other fork have quotas of their own, untouched.
	mustRun(t, parent, "dd if=/dev/zero of=/root/more bs=1M count=16 2>/dev/null")
	mustRun(t, other, "dd if=/dev/zero of=/root/more bs=1M count=16 2>/dev/null")

	mustRun(t, fork, "rm /root/fill && echo again > /root/again")
	if err := fork.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if m := agentboxInfo(t, d).DiskQuota; m == api.DiskQuotaLoopExt4 {
		dir := filepath.Join(d.dataDir, "sandboxes", fork.ID())
		eventually(t, "fork's quota fs unmounted on hibernate", func() bool {
			return !slices.Contains(mountsUnder(t, dir), dir)
		})
	}
	if got := mustRun(t, fork, "cat /root/again /root/name"); got != "again\nbase\n" {
		t.Fatalf("fork after wake: %q", got)
	}

	deleteAllDisksGone(t, d, fork, other, parent)
}

// A daemon killed with quota sandboxes running re-adopts them (their
// filesystems stay mounted); a clean shutdown after deleting them leaves
// no mount under the data dir at all.
func TestLimitsDiskQuotaRestart(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: 32 << 20}})
	mustRun(t, sb, "echo kept > /root/f")
	d.restart(syscall.SIGKILL)
	if got := mustRun(t, sb, "cat /root/f; df -k / | tail -1 | awk '{print $2}'"); !strings.HasPrefix(got, "kept\n") {
		t.Fatalf("after restart: %q", got)
	}
	res := run(t, sb, "dd if=/dev/zero of=/root/big bs=1M count=64 2>&1")
	if !strings.Contains(string(res.Stdout), "No space left") {
		t.Fatalf("quota lost across restart: %s", res.Stdout)
	}
	if err := sb.Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.stop(syscall.SIGTERM)
	if m := mountsUnder(t, d.dataDir); len(m) != 0 {
		t.Fatalf("mounts left after shutdown: %v", m)
	}
	eventually(t, "no loop devices", func() bool { return len(loopsOf(t, d.dataDir)) == 0 })
	d.start()
}

// Memory: a process over the limit is OOM-killed, the sandbox survives,
// inspect counts the kill and an oom event is recorded. Pids: a fork bomb
// is contained and the sandbox still answers. Open files: every process
// has the limit, and cannot open more.
func TestLimitsMemoryPidsOpenFiles(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{MemoryBytes: 64 << 20, PidsMax: 64, OpenFiles: 100}})
	ctx := context.Background()

	res := run(t, sb, "head -c 300000000 /dev/zero | tail > /dev/null")
	if res.ExitCode == 0 {
		t.Fatalf("allocating 300 MB under a 64 MiB limit succeeded")
	}
	res = run(t, sb, "exec tail -c 300000000 /dev/zero") // the exec'd process itself is killed
	if res.Signal != "KILL" {
		t.Fatalf("exit %d signal %q, want KILL", res.ExitCode, res.Signal)
	}
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := sb.Info().OOMKills; n < 2 {
		t.Fatalf("oom_kills = %d, want >= 2", n)
	}
	evs, err := sb.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ooms int
	for _, ev := range evs {
		if ev.Type == "oom" {
			ooms++
		}
	}
	if ooms == 0 {
		t.Fatalf("no oom event among %+v", evs)
	}

	// A fork loop: processes are refused at the limit (read on the host
	// while they live), and once they are gone the sandbox answers again.
	// (busybox sh gives up at its first failed fork: exit 2.)
	// The guest's own threads count against pids_max too: note them first.
	baseline := 0
	for _, p := range []string{sandboxCgroupFile("pids", sb.ID(), "pids.current"), sandboxCgroupFile("", sb.ID(), "pids.current")} {
		if b, err := os.ReadFile(p); err == nil {
			baseline, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			break
		}
	}
	res = run(t, sb, "i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); done 2>/dev/null; echo spawned")
	if res.ExitCode == 0 {
		t.Fatalf("200 processes under pids_max 64: %q", res.Stdout)
	}
	var current []byte
	var pidsFile string
	for _, p := range []string{sandboxCgroupFile("pids", sb.ID(), "pids.current"), sandboxCgroupFile("", sb.ID(), "pids.current")} {
		if b, err := os.ReadFile(p); err == nil {
			current, pidsFile = b, p
			break
		}
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(current))); err != nil || n < 32 || n > 64 {
		t.Fatalf("pids.current %q with pids_max 64 after a 200-process loop", current)
	}
	// The loop's sleepers (3 s each) end and are reaped by the guest; on a
	// loaded 2-core machine that can take a few seconds more.
	eventuallyWithin(t, 20*time.Second, "the fork loop's processes are gone", func() bool {
		b, err := os.ReadFile(pidsFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && n <= baseline+4 // the guest may have started a thread or two
	})
	eventually(t, "sandbox answers after the fork loop", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := sb.Run(ctx, "true")
		return err == nil && r.ExitCode == 0
	})

	if got := strings.Fields(mustRun(t, sb, "ulimit -n; ulimit -Hn")); len(got) != 2 || got[0] != "100" || got[1] != "100" {
		t.Fatalf("ulimit = %v, want 100 100", got)
	}
	// Every descendant has it, as the kernel reports.
	lim := mustRun(t, sb, "sh -c 'sh -c \"grep \\\"open files\\\" /proc/self/limits\"'")
	if f := strings.Fields(lim); len(f) < 5 || f[3] != "100" || f[4] != "100" {
		t.Fatalf("/proc/self/limits: %q", lim)
	}
	// Raising it back is refused.
	if res := run(t, sb, "ulimit -n 1000"); res.ExitCode == 0 {
		t.Fatalf("raising the open-files limit succeeded")
	}
}

// Invalid limits are refused before anything is made.
func TestLimitsValidation(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	for _, r := range []api.Resources{
		{DiskBytes: 1 << 20},
		{DiskInodes: 100},
		{OpenFiles: 10},
		{DiskBytes: -1},
	} {
		if _, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Resources: r}); err == nil || !agentbox.IsInvalidArgument(err) {
			t.Errorf("create with %+v: %v, want invalid argument", r, err)
		}
	}
}

// A sandbox with a busy loop is reported CPU-bound (and yields the CPU)
// while the loop runs, and only then; a calm neighbour never is.
func TestLimitsCPUBound(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	info, err := d.client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.Capabilities, "cpu-yield") {
		t.Fatalf("capabilities %v lack cpu-yield (cgroup cpu.idle, Linux 5.15+)", info.Capabilities)
	}
	busy := d.create(t, agentbox.SandboxSpec{})
	calm := d.create(t, agentbox.SandboxSpec{})
	cpuBound := func(sb *agentbox.Sandbox) bool {
		if err := sb.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		return sb.Info().CPUBound
	}
	pid := strings.TrimSpace(mustRun(t, busy, "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"))
	eventually(t, "the busy sandbox is reported CPU-bound", func() bool { return cpuBound(busy) })
	if cpuBound(calm) {
		t.Fatal("the calm sandbox is reported CPU-bound")
	}
	mustRun(t, busy, "kill "+pid)
	eventually(t, "the busy sandbox is no longer CPU-bound once its loop ends", func() bool { return !cpuBound(busy) })
}

// TestLimitsDiskQuotaGvisor: the disk quota holds on the gvisor backend
// too, where runsc's gofer writes the sandbox's files into the same
// quota'd writable layer: ENOSPC inside, the host loses no more than the
// quota, the inode cap holds, the sandbox writes again once it frees
// space, and delete leaves no mount, loop device or image.
func TestLimitsDiskQuotaGvisor(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	if m := agentboxInfo(t, d).DiskQuota; m != api.DiskQuotaLoopExt4 && m != api.DiskQuotaXFSProject {
		t.Fatalf("agentbox info: disk_quota %q, want a method", m)
	}
	const quota = 64 << 20
	full := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor", Resources: api.Resources{DiskBytes: quota, DiskInodes: 2048}})
	if full.Info().Backend != "gvisor" {
		t.Fatalf("backend = %q, want gvisor", full.Info().Backend)
	}
	fillDisk(t, full, quota, d.dataDir, 32<<20)
	fillInodes(t, full, 2048)
	if got := mustRun(t, full, "rm -rf /root/many && echo again > /root/again && cat /root/again"); got != "again\n" {
		t.Fatalf("after freeing space: %q", got)
	}
	deleteAllDisksGone(t, d, full)
}
