package test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// fileEffects returns, per run after seq after, the files it changed
// as the flight recorder has them (everything but the time).
func fileEffects(t *testing.T, sb *agentbox.Sandbox, after uint64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	evs, err := sb.QueryEvents(ctx, agentbox.EventQuery{After: after})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	cur := ""
	for _, ev := range evs {
		switch {
		case ev.Type == api.EventRunStarted:
			cur = "run " + ev.Run.Command + ":"
		case ev.Type == api.EventRunEnded:
			if ev.Run.FilesTruncated || ev.Run.FilesOmitted > 0 {
				cur += " [truncated]"
			}
			out = append(out, cur)
		case ev.File != nil:
			f := ev.File
			cur += fmt.Sprintf("\n  %s %s %s size=%d mode=%s sha=%.12s target=%s", f.Change, f.Path, f.Kind, f.Size, f.Mode, f.SHA256, f.Target)
		}
	}
	return out
}

// lastSeq is the sequence number of sb's last event.
func lastSeq(t *testing.T, sb *agentbox.Sandbox) uint64 {
	t.Helper()
	evs, err := sb.QueryEvents(context.Background(), agentbox.EventQuery{})
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %v", err)
	}
	return evs[len(evs)-1].Seq
}

// hidingWorkload is a workload from inside a sandbox that tries to hide
// changes from an event-driven view of its writable layer: rename
// storms of files and directories (entries below a moved directory get
// no event), hard links (a change through one name is one of the
// other's too; a link made and removed in one run changes only the
// first name's ctime), files created and deleted within a run, a
// directory replaced by a file, a directory changed while it was moved
// elsewhere, lower-layer files copied up and deleted (whiteouts), a
// file rewritten in place.
var hidingWorkload = []string{
	"mkdir -p /root/a/b/c /root/d && echo 1 > /root/a/b/c/f && echo 2 > /root/d/g && echo 3 > /root/top && ln /root/top /root/d/hard",
	"echo new > /root/n1; echo more >> /root/top; rm /root/d/g",
	"mv /root/a /root/z",
	"echo x > /root/z/b/c/f2; echo y >> /root/z/b/c/f",
	"mv /root/z /root/a; mv /root/a/b /root/a/b2; mv /root/a/b2 /root/a/b",
	"mv /root/a /root/z; echo x > /root/z/b/c/new; mv /root/z /root/a",
	"cd /root; for i in 1 2 3 4 5 6 7 8 9 10; do mv top top.$i; mv top.$i top; done",
	"echo via-link >> /root/d/hard",
	"ln /root/top /root/tmp-link; rm /root/tmp-link",
	"echo gone > /root/tmp; rm /root/tmp; mkdir /root/tmpd; touch /root/tmpd/x; rm -r /root/tmpd",
	"rm -r /root/a/b; echo file > /root/a/b",
	"chmod 600 /root/n1; truncate -s 0 /root/d/hard",
	"echo changed >> /etc/group; rm /etc/hostname; mv /etc/passwd /etc/passwd.old",
	"ln -s /etc/passwd /root/link; mkfifo /root/fifo; mkdir -p /root/deep/er/est; mv /root/deep /root/d/",
	"rm -rf /root/d; mkdir /root/d; echo back > /root/d/g",
	"dd if=/dev/zero of=/root/m bs=4096 count=1 2>/dev/null; printf mmap | dd of=/root/m conv=notrunc 2>/dev/null",
}

// recordsMatch runs hidingWorkload in a sandbox of spec on each daemon
// and fails unless their file records match run for run.
func recordsMatch(t *testing.T, tracked, walked *daemon, spec agentbox.SandboxSpec) {
	t.Helper()
	var records [2][]string
	for i, d := range []*daemon{tracked, walked} {
		sb := d.create(t, spec)
		after := lastSeq(t, sb)
		for _, cmd := range hidingWorkload {
			mustRun(t, sb, cmd)
		}
		records[i] = fileEffects(t, sb, after)
	}
	if strings.Join(records[0], "\n") != strings.Join(records[1], "\n") {
		for i := range max(len(records[0]), len(records[1])) {
			var a, b string
			if i < len(records[0]) {
				a = records[0][i]
			}
			if i < len(records[1]) {
				b = records[1][i]
			}
			if a != b {
				t.Errorf("run %d:\ntracked: %s\nwalked:  %s", i, a, b)
			}
		}
		t.FailNow()
	}
}

// The flight recorder's change tracker (fanotify on the writable layers'
// filesystems) records exactly what listing the layer before and after
// each run records, for hidingWorkload: two daemons, one walking
// (--audit-walk), run it; their records must match run for run. Then, on
// the tracking daemon, a layer of 30,000 files (past the 20,000 entries
// a walk lists) records a change deep in it.
func TestFlightRecorderTrackerMatchesWalk(t *testing.T) {
	tracked := newDaemonWith(t, "--audit-track-from", "0")
	walked := newDaemonWith(t, "--audit-walk")
	recordsMatch(t, tracked, walked, agentbox.SandboxSpec{})
	workload := hidingWorkload
	// Linux 6.6 and later report overlayfs's writes on its upper dir;
	// before, the daemon finds out at start and walks (docs/AUDIT.md).
	b, err := os.ReadFile(tracked.logPath)
	if err != nil {
		t.Fatal(err)
	}
	hasTracker := !strings.Contains(string(b), "no change tracker")
	if kernelAtLeast(6, 6) && !hasTracker {
		t.Fatalf("no change tracker on %s:\n%s", kernelRelease(), grepLines(string(b), "change tracker"))
	}
	// (The test daemons log at debug level: each tracked run is there.)
	if n := strings.Count(string(b), "audit: tracked run"); hasTracker && n < len(workload) {
		t.Fatalf("%d runs tracked, want %d:\n%s", n, len(workload), grepLines(string(b), "audit: "))
	}

	sb := tracked.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "mkdir -p /root/big && cd /root/big && for d in $(seq 30); do mkdir -p d$d/x/y; cd d$d/x/y; for f in $(seq 1000); do : > f$f; done; cd /root/big; done")
	after := lastSeq(t, sb)
	mustRun(t, sb, "echo changed > /root/big/d30/x/y/f1000")
	got := fileEffects(t, sb, after)
	want := "run echo changed > /root/big/d30/x/y/f1000:\n  modified /root/big/d30/x/y/f1000 file size=8 mode=0644 sha=7f8b1dfc466b target="
	if !hasTracker {
		// Walked: the listing stops at 20,000 entries, and says so.
		want = "run echo changed > /root/big/d30/x/y/f1000: [truncated]"
	}
	if len(got) != 1 || got[0] != want {
		b, _ := os.ReadFile(tracked.logPath)
		t.Fatalf("a change deep in a layer of 30,000 files:\n%s\nwant:\n%s\nthe daemon's tracker:\n%s", strings.Join(got, "\n"), want, grepLines(string(b), "audit: "))
	}
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	b := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func kernelAtLeast(major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(kernelRelease(), "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || (a == major && b >= minor)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Under gVisor, runsc's gofer writes into the same host overlay: the
// tracker follows it as under native.
func TestFlightRecorderTrackerMatchesWalkGvisor(t *testing.T) {
	requiresRunsc(t)
	tracked := newDaemonWith(t, "--audit-track-from", "0")
	walked := newDaemonWith(t, "--audit-walk")
	recordsMatch(t, tracked, walked, agentbox.SandboxSpec{Runtime: "gvisor"})
	b, err := os.ReadFile(tracked.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "audit: tracked run"); kernelAtLeast(6, 6) && n < len(hidingWorkload) {
		t.Fatalf("%d runs tracked, want %d:\n%s", n, len(hidingWorkload), grepLines(string(b), "audit: "))
	}
}
