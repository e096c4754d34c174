package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestDestroyLeavesNothing: after rm, no process (setsid and double-forked
// escapees included), mount, cgroup or namespace of the sandbox remains.
func TestDestroyLeavesNothing(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID()
	// busybox has no nohup applet: the trap is what nohup does.
	mustRun(t, sb, "setsid sh -c 'sleep 1000 & sleep 1000 &' ; sh -c 'trap \"\" HUP; exec sleep 1000' >/dev/null 2>&1 & (sleep 1000 &) ; echo started")
	time.Sleep(200 * time.Millisecond)
	pids := sandboxPids(t, id)
	if len(pids) < 5 {
		t.Fatalf("expected the guest and at least 4 sleepers in the sandbox's cgroup, found pids %v", pids)
	}
	nss := nsInodes(t, pids[len(pids)-1])
	if len(nss) != 7 {
		t.Fatalf("namespaces of pid %d: %v", pids[len(pids)-1], nss)
	}
	if len(cgroupDirs(id)) == 0 {
		t.Fatal("sandbox has no cgroup directory while running")
	}

	if err := sb.Delete(ctx); err != nil {
		t.Fatalf("delete: %v", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); len(b) > 0 {
				t.Errorf("pid %d (%q) survived delete", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
			}
		}
	}
	if left := sandboxPids(t, id); len(left) != 0 {
		t.Errorf("processes left in the sandbox's cgroup: %v", left)
	}
	if dirs := cgroupDirs(id); len(dirs) != 0 {
		t.Errorf("cgroup dirs left: %v", dirs)
	}
	if holders := liveNamespaceHolders(nss); len(holders) != 0 {
		t.Errorf("processes still in the sandbox's namespaces: %v", holders)
	}
	if m := hostMountsContaining(t, id); len(m) != 0 {
		t.Errorf("host mounts left: %v", m)
	}
	if _, err := os.Stat(d.dataDir + "/sandboxes/" + id); !os.IsNotExist(err) {
		t.Errorf("sandbox dir left: %v", err)
	}
	if _, err := d.client.Get(ctx, id); !agentbox.IsNotFound(err) {
		t.Errorf("get after delete: %v, want not found", err)
	}
}

// TestDaemonCrashDuringStreamingExec: kill -9 of the daemon in the middle of
// a streaming exec; the restarted daemon lists the sandbox running, accepts
// exec, and nothing is duplicated or leaked.
func TestDaemonCrashDuringStreamingExec(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Labels: map[string]string{"suite": "crash"}})
	mustRun(t, sb, "echo before > /root/state")
	guestPids := sandboxPids(t, sb.ID())

	// Start a streaming exec over raw HTTP and read its first lines.
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body, _ := json.Marshal(api.ExecRequest{Command: "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done"})
	req, _ := http.NewRequest("POST", "http://agentbox/v1/sandboxes/"+sb.ID()+"/exec", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var pid int
	ticks := 0
	for sc.Scan() && ticks < 3 {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("bad event %q: %v", sc.Text(), err)
		}
		switch ev.Type {
		case api.EventStarted:
			pid = ev.Pid
		case api.EventStdout:
			if strings.Contains(string(ev.Data), "tick") {
				ticks++
			}
		}
	}
	if pid == 0 || ticks < 3 {
		t.Fatalf("stream did not start: pid %d ticks %d", pid, ticks)
	}

	d.restart(syscall.SIGKILL)

	sbs, err := d.client.List(ctx, map[string]string{"suite": "crash"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || sbs[0].ID() != sb.ID() || sbs[0].Info().State != api.StateRunning {
		t.Fatalf("after restart: %d sandboxes %+v, want exactly %s running", len(sbs), sbs, sb.ID())
	}
	if out := mustRun(t, sb, "cat /root/state"); strings.TrimSpace(out) != "before" {
		t.Fatalf("state after restart: %q", out)
	}
	// The streaming process kept running inside and can be re-attached.
	procs, err := sb.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		if p.Pid == pid && p.Running {
			found = true
		}
	}
	if !found {
		t.Fatalf("process %d not running after daemon restart: %+v", pid, procs)
	}
	if err := sb.Process(pid).Signal(ctx, "KILL"); err != nil {
		t.Fatalf("kill re-adopted process: %v", err)
	}
	// Same guest, no duplicate guests.
	after := sandboxPids(t, sb.ID())
	if len(guestPids) == 0 || !contains(after, guestPids[0]) {
		t.Fatalf("guest pid changed: before %v after %v", guestPids, after)
	}
	all, err := d.client.List(ctx, nil)
	if err != nil || len(all) != 1 {
		t.Fatalf("sandboxes after restart: %d, %v", len(all), err)
	}
}

// TestDaemonReapsDeadSandboxes: a sandbox whose guest died while the daemon
// was down is cleaned up at start-up.
func TestDaemonReapsDeadSandboxes(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	pids := sandboxPids(t, sb.ID())
	d.stop(syscall.SIGKILL)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	time.Sleep(100 * time.Millisecond)
	d.start()
	if _, err := d.client.Get(ctx, sb.ID()); !agentbox.IsNotFound(err) {
		t.Fatalf("dead sandbox after restart: %v, want not found", err)
	}
	if dirs := cgroupDirs(sb.ID()); len(dirs) != 0 {
		t.Fatalf("cgroups of the dead sandbox left: %v", dirs)
	}
	if _, err := os.Stat(d.dataDir + "/sandboxes/" + sb.ID()); !os.IsNotExist(err) {
		t.Fatalf("dir of the dead sandbox left: %v", err)
	}
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
