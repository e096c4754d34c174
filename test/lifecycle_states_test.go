package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Integration tests of the lifecycle state machine (api/lifecycle.go):
// pause (frozen, memory kept), hibernate (nothing resident, filesystem
// kept), wake on use, idle policy, presets, daemon restart.

// cpuUsage reads the sandbox's cumulative CPU time in nanoseconds from its
// cgroup on the host (v1 cpuacct.usage, or v2 cpu.stat usage_usec).
func cpuUsage(t *testing.T, id string) int64 {
	t.Helper()
	for _, pattern := range []string{"/sys/fs/cgroup/cpuacct*/agentbox*/" + id + "/cpuacct.usage", "/sys/fs/cgroup/*/agentbox*/" + id + "/cpuacct.usage"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			b, err := os.ReadFile(m[0])
			if err != nil {
				t.Fatal(err)
			}
			n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	b, err := os.ReadFile(sandboxCgroupFile("", id, "cpu.stat"))
	if err != nil {
		t.Fatalf("no cpu accounting for sandbox %s: %v", id, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n * 1000
		}
	}
	t.Fatalf("no usage_usec in cpu.stat")
	return 0
}

func stateOf(t *testing.T, sb *agentbox.Sandbox) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	return sb.Info().State
}

func transitionCauses(t *testing.T, sb *agentbox.Sandbox) []string {
	t.Helper()
	ts, err := sb.Transitions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tr := range ts {
		out = append(out, tr.From+">"+tr.To+":"+tr.Cause)
	}
	return out
}

// Pause really stops CPU use: a busy loop's CPU time does not advance while
// the sandbox is paused, and does again once an exec has woken it.
func TestLifecyclePauseStopsCPU(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	id := sb.ID()
	mustRun(t, sb, "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > /tmp/busy.pid")
	time.Sleep(300 * time.Millisecond)
	u0 := cpuUsage(t, id)
	time.Sleep(300 * time.Millisecond)
	if u1 := cpuUsage(t, id); u1-u0 < int64(50*time.Millisecond) {
		t.Fatalf("busy loop used only %v of CPU in 300ms while running", time.Duration(u1-u0))
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, sb); s != api.StatePaused {
		t.Fatalf("state %s after pause", s)
	}
	p0 := cpuUsage(t, id)
	time.Sleep(700 * time.Millisecond)
	if p1 := cpuUsage(t, id); p1 != p0 {
		t.Fatalf("CPU time advanced by %v while paused", time.Duration(p1-p0))
	}
	pids := sandboxPids(t, id)
	if len(pids) < 2 {
		t.Fatalf("processes of the paused sandbox are gone: %v", pids)
	}
	// Memory kept: the same busy process is there after an exec wakes it.
	out := mustRun(t, sb, "kill -0 $(cat /tmp/busy.pid) && echo alive")
	if strings.TrimSpace(out) != "alive" || stateOf(t, sb) != api.StateRunning {
		t.Fatalf("after wake: %q, state %s", out, sb.Info().State)
	}
	r0 := cpuUsage(t, id)
	time.Sleep(300 * time.Millisecond)
	if r1 := cpuUsage(t, id); r1 == r0 {
		t.Fatal("busy loop does not run after the wake")
	}
	want := []string{"creating>running:create", "running>paused:api", "paused>running:wake"}
	if got := transitionCauses(t, sb); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

// Hibernate stops every process; an exec wakes the sandbox with the same
// id and hostname, and its files (written, and a template file deleted,
// before hibernation) are intact.
func TestLifecycleHibernateAndWake(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Hostname: "cold-box"})
	id := sb.ID()
	// Only the sleep in the background: "a && b &" would background the
	// writes too, and a slow machine hibernates before they are done.
	mustRun(t, sb, "echo kept > /root/data.txt && mkdir -p /opt/x && echo deep > /opt/x/y && rm /etc/shells && { sleep 1000 >/dev/null 2>&1 & }")
	if len(sandboxPids(t, id)) < 2 {
		t.Fatal("sandbox has no processes before hibernation")
	}
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, sb); s != api.StateHibernated {
		t.Fatalf("state %s after hibernate", s)
	}
	if pids := sandboxPids(t, id); len(pids) != 0 {
		t.Fatalf("processes of the hibernated sandbox remain: %v", pids)
	}
	if dirs := cgroupDirs(id); len(dirs) != 0 {
		t.Fatalf("cgroups of the hibernated sandbox remain: %v", dirs)
	}
	// With the loop disk method the writable layer is in the sandbox's
	// image (unmounted while it hibernates), else in its sandbox dir.
	if agentboxInfo(t, d).DiskQuota == api.DiskQuotaLoopExt4 {
		if _, err := os.Stat(filepath.Join(d.dataDir, "disks", id+".img")); err != nil {
			t.Fatalf("the writable layer's image is not kept on disk: %v", err)
		}
	} else if _, err := os.Stat(filepath.Join(d.dataDir, "sandboxes", id, "upper", "root", "data.txt")); err != nil {
		t.Fatalf("the writable layer is not kept on disk: %v", err)
	}
	start := time.Now()
	out := mustRun(t, sb, "cat /root/data.txt /opt/x/y; test ! -e /etc/shells && echo shells-gone; hostname; pidof sleep || echo no-sleep")
	t.Logf("first exec on the hibernated sandbox took %v", time.Since(start))
	if want := "kept\ndeep\nshells-gone\ncold-box\nno-sleep\n"; out != want {
		t.Fatalf("after wake: %q, want %q (files intact, no process survived)", out, want)
	}
	if s := stateOf(t, sb); s != api.StateRunning || sb.ID() != id {
		t.Fatalf("state %s after wake", s)
	}
	// Explicit resume from hibernated, and a file call as the waking call.
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := sb.ReadFile(ctx, "/root/data.txt")
	if err != nil || string(b) != "kept\n" {
		t.Fatalf("read after hibernate: %q %v", b, err)
	}
	want := []string{"creating>running:create", "running>hibernated:api", "hibernated>running:wake",
		"running>hibernated:api", "hibernated>running:api", "running>hibernated:api", "hibernated>running:wake"}
	if got := transitionCauses(t, sb); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	// Conflicts: pausing a hibernated sandbox.
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); !agentbox.IsConflict(err) {
		t.Fatalf("pause of a hibernated sandbox: %v, want conflict", err)
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatalf("delete of a hibernated sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dataDir, "sandboxes", id)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after delete: %v", err)
	}
}

// The idle policy in real time, with second-scale durations: a session
// sandbox is paused then deleted; a persistent one paused then hibernated
// and kept. (The policy logic itself is unit-tested with a fake clock in
// internal/sandbox.)
func TestLifecycleIdlePolicy(t *testing.T) {
	d := newDaemon(t)
	session := d.create(t, agentbox.SandboxSpec{Idle: &agentbox.IdlePolicy{PauseAfterSeconds: 1, DeleteAfterSeconds: 3}})
	persistent := d.create(t, agentbox.SandboxSpec{Lifecycle: agentbox.LifecyclePersistent,
		Idle: &agentbox.IdlePolicy{PauseAfterSeconds: 1, HibernateAfterSeconds: 2}})
	if info := persistent.Info(); info.Lifecycle != "persistent" || info.Idle == nil || info.Idle.HibernateAfterSeconds != 2 || info.Idle.DeleteAfterSeconds != 0 {
		t.Fatalf("persistent sandbox's effective policy: %+v %+v", info.Lifecycle, info.Idle)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("session paused", func() bool { return stateOf(t, session) == api.StatePaused })
	waitFor("persistent hibernated", func() bool { return stateOf(t, persistent) == api.StateHibernated })
	waitFor("session deleted", func() bool {
		_, err := d.client.Get(context.Background(), session.ID())
		return agentbox.IsNotFound(err)
	})
	got := transitionCauses(t, persistent)
	if want := "creating>running:create running>paused:idle paused>hibernated:idle"; strings.Join(got, " ") != want {
		t.Fatalf("persistent transitions %v, want %s", got, want)
	}
	time.Sleep(1500 * time.Millisecond)
	if s := stateOf(t, persistent); s != api.StateHibernated {
		t.Fatalf("persistent sandbox is %s, want still hibernated", s)
	}
	if out := mustRun(t, persistent, "echo awake"); out != "awake\n" {
		t.Fatalf("exec on the idle-hibernated sandbox: %q", out)
	}
}

// lifecycle: persistent with a name: creating it again (CLI and SDK)
// returns the same sandbox, woken, with everything installed still there.
func TestLifecyclePersistentByName(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(agentboxBin(t), args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("agentbox %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	id1 := cli("create", "--template", "busybox", "--name", "hermes", "--lifecycle", "persistent")
	t.Cleanup(func() { _ = d.client.Sandbox(id1).Delete(context.Background()) })
	sb := d.client.Sandbox(id1)
	mustRun(t, sb, "echo installed > /root/tool")
	if out := cli("hibernate", id1); !strings.Contains(out, "hibernated") {
		t.Fatalf("agentbox hibernate: %q", out)
	}
	id2 := cli("create", "--template", "busybox", "--name", "hermes", "--lifecycle", "persistent")
	if id2 != id1 {
		t.Fatalf("second create by name made %s, want %s", id2, id1)
	}
	if s := stateOf(t, sb); s != api.StateRunning {
		t.Fatalf("create by name left it %s", s)
	}
	if out := mustRun(t, sb, "cat /root/tool"); out != "installed\n" {
		t.Fatalf("installed file after reuse: %q", out)
	}
	// Over HTTP: 200 (not 201) for the existing sandbox, 201 for a new one.
	if code, body := d.rawRequest(t, "POST", "/v1/sandboxes", []byte(`{"template":"busybox","name":"hermes","lifecycle":"persistent"}`)); code != 200 || !strings.Contains(string(body), id1) {
		t.Fatalf("create by existing name: %d %s", code, body)
	}
	other, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox", Name: "sprite"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Delete(context.Background()) })
	if other.ID() == id1 || other.Info().Lifecycle != "session" {
		t.Fatalf("another name: %s %s", other.ID(), other.Info().Lifecycle)
	}
	if _, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "debian", Name: "hermes"}); !agentbox.IsConflict(err) {
		t.Fatalf("same name, other template: %v, want conflict", err)
	}
	cli("pause", id1)
	if s := stateOf(t, sb); s != api.StatePaused {
		t.Fatalf("agentbox pause: %s", s)
	}
	cli("resume", id1)
	if s := stateOf(t, sb); s != api.StateRunning {
		t.Fatalf("agentbox resume: %s", s)
	}
	// Once deleted, the name is free again.
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	id3 := cli("create", "--template", "busybox", "--name", "hermes", "--lifecycle", "persistent")
	t.Cleanup(func() { _ = d.client.Sandbox(id3).Delete(context.Background()) })
	if id3 == id1 {
		t.Fatal("a deleted sandbox's name returned the deleted sandbox")
	}
}

// A restarted daemon keeps a paused sandbox paused (its processes frozen,
// not thawed) and a hibernated one hibernated; both wake on use.
func TestLifecycleRestartKeepsSleepingSandboxes(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	warm := d.create(t, agentbox.SandboxSpec{})
	cold := d.create(t, agentbox.SandboxSpec{Lifecycle: agentbox.LifecyclePersistent})
	mustRun(t, warm, "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > /tmp/busy.pid")
	mustRun(t, cold, "echo cold > /root/f")
	if err := warm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cold.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		d.restart(sig)
		if s := stateOf(t, warm); s != api.StatePaused {
			t.Fatalf("after restart (%v): warm sandbox is %s", sig, s)
		}
		if s := stateOf(t, cold); s != api.StateHibernated {
			t.Fatalf("after restart (%v): cold sandbox is %s", sig, s)
		}
		u0 := cpuUsage(t, warm.ID())
		time.Sleep(300 * time.Millisecond)
		if u1 := cpuUsage(t, warm.ID()); u1 != u0 {
			t.Fatalf("after restart (%v): paused sandbox used CPU (thawed)", sig)
		}
		if pids := sandboxPids(t, cold.ID()); len(pids) != 0 {
			t.Fatalf("after restart: hibernated sandbox has processes %v", pids)
		}
	}
	d.client.Sandbox(warm.ID())
	if out := mustRun(t, warm, "kill -0 $(cat /tmp/busy.pid) && echo alive"); out != "alive\n" {
		t.Fatalf("warm sandbox after wake: %q", out)
	}
	if out := mustRun(t, cold, "cat /root/f"); out != "cold\n" {
		t.Fatalf("cold sandbox after wake: %q", out)
	}
	// A persistent sandbox whose guest is gone at start-up (host reboot)
	// is kept hibernated, not reaped.
	pids := sandboxPids(t, cold.ID())
	d.stop(syscall.SIGKILL)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	d.start()
	if s := stateOf(t, cold); s != api.StateHibernated {
		t.Fatalf("persistent sandbox with a dead guest is %s after restart, want hibernated", s)
	}
	if out := mustRun(t, cold, "cat /root/f"); out != "cold\n" {
		t.Fatalf("persistent sandbox after a lost guest: %q", out)
	}
	if got := transitionCauses(t, cold); !strings.Contains(strings.Join(got, " "), ">hibernated:recover") {
		t.Fatalf("transitions %v lack the recovery", got)
	}
}
