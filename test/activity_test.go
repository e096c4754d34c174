package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
)

// Issue 17, finding 5: a running detached process is activity. These
// tests assert that something does not happen for a while (the sandbox
// is not paused), so they watch it for a span well past the idle policy's
// steps (2 s and 6 s) instead of polling for a condition.

// cliState returns the state `agentbox inspect` reports for id.
func cliState(t *testing.T, d *daemon, id string) string {
	t.Helper()
	sb, err := d.client.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Info().State
}

// waitState polls until id is in state want (generous deadline).
func waitState(t *testing.T, d *daemon, id, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := cliState(t, d, id)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %s after 30s, want %s", id, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIdleDetachedProcessKeepsSandboxAwake: a persistent sandbox with
// --pause-after 2s --hibernate-after 6s running an `exec -d` loop stays
// running (and the loop keeps ticking) for well past both steps; paused
// by hand, it is not hibernated by the idle policy (that would kill the
// loop); once the loop is killed, the idle policy pauses and hibernates
// it as before.
func TestIdleDetachedProcessKeepsSandboxAwake(t *testing.T) {
	d := newDaemon(t)
	out, errOut, code := d.cli(t, "create", "--lifecycle", "persistent", "--pause-after", "2s", "--hibernate-after", "6s")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	out, errOut, code = d.cli(t, "exec", "-d", id, "--", "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.5; done")
	if code != 0 {
		t.Fatalf("exec -d: exit %d: %s", code, errOut)
	}
	pid := strings.TrimSpace(out)

	ticks := func() int {
		t.Helper()
		out, errOut, code := d.cli(t, "exec", id, "--", "sh", "-c", "wc -l < /tmp/ticks")
		if code != 0 {
			t.Fatalf("counting ticks: exit %d: %s", code, errOut)
		}
		var n int
		for _, c := range strings.TrimSpace(out) {
			n = n*10 + int(c-'0')
		}
		return n
	}
	before := ticks()
	// Past both steps of the policy, counted from the exec that counted.
	until := time.Now().Add(10 * time.Second)
	for time.Now().Before(until) {
		if s := cliState(t, d, id); s != api.StateRunning {
			t.Fatalf("sandbox with a running detached process is %s, want running; transitions:\n%s", s, cliTransitions(t, d, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if after := ticks(); after < before+10 {
		t.Fatalf("the detached loop ticked %d times in 10s, want ≥10 (it was frozen or killed)", after-before)
	}

	// Paused by hand with the loop running: the idle policy does not
	// hibernate it (hibernating kills every process).
	if _, errOut, code := d.cli(t, "pause", id); code != 0 {
		t.Fatalf("pause: exit %d: %s", code, errOut)
	}
	until = time.Now().Add(9 * time.Second)
	for time.Now().Before(until) {
		if s := cliState(t, d, id); s != api.StatePaused {
			t.Fatalf("sandbox paused with a running detached process is %s, want paused; transitions:\n%s", s, cliTransitions(t, d, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, errOut, code = d.cli(t, "ps", id)
	if code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("ps after the pause: exit %d: %s%s", code, out, errOut)
	}

	// The loop gone, the policy applies again.
	if _, errOut, code := d.cli(t, "kill", id, pid, "KILL"); code != 0 {
		t.Fatalf("kill: exit %d: %s", code, errOut)
	}
	waitState(t, d, id, api.StateHibernated)
	if tr := cliTransitions(t, d, id); !strings.Contains(tr, "hibernated") || !strings.Contains(tr, "idle") {
		t.Fatalf("transitions after the loop ended:\n%s", tr)
	}
}

// TestIdleIgnoresBackground: with --idle-ignores-background a detached
// process does not keep the sandbox awake: it is paused while the process
// runs.
func TestIdleIgnoresBackground(t *testing.T) {
	d := newDaemon(t)
	out, errOut, code := d.cli(t, "create", "--lifecycle", "persistent", "--pause-after", "1s", "--idle-ignores-background")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, errOut, code := d.cli(t, "exec", "-d", id, "--", "sleep", "1000"); code != 0 {
		t.Fatalf("exec -d: exit %d: %s", code, errOut)
	}
	waitState(t, d, id, api.StatePaused)
	out, _, _ = d.cli(t, "inspect", id)
	if !strings.Contains(out, `"ignore_background": true`) {
		t.Fatalf("inspect does not show the policy:\n%s", out)
	}
}

func cliTransitions(t *testing.T, d *daemon, id string) string {
	t.Helper()
	out, errOut, _ := d.cli(t, "transitions", id)
	return out + errOut
}

// TestIdleLeftBehindProcessKeepsSandboxAwake: a process a foreground exec
// left running ("server &") is activity too: the guest, PID 1, sees it.
func TestIdleLeftBehindProcessKeepsSandboxAwake(t *testing.T) {
	d := newDaemon(t)
	out, errOut, code := d.cli(t, "create", "--pause-after", "1s")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	if _, errOut, code := d.cli(t, "exec", id, "--", "sh", "-c", "sleep 1000 >/dev/null 2>&1 </dev/null &"); code != 0 {
		t.Fatalf("exec: exit %d: %s", code, errOut)
	}
	until := time.Now().Add(5 * time.Second)
	for time.Now().Before(until) {
		if s := cliState(t, d, id); s != api.StateRunning {
			t.Fatalf("sandbox with a process left running is %s, want running; transitions:\n%s", s, cliTransitions(t, d, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	kill := `for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && kill ${p#/proc/}; done; true`
	if _, errOut, code := d.cli(t, "exec", id, "--", "sh", "-c", kill); code != 0 {
		t.Fatalf("killing the sleep: exit %d: %s", code, errOut)
	}
	waitState(t, d, id, api.StatePaused)
}
