package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

const auditCanary = "canary-AUDIT-51f0e2d7c3b9"

// describeEvent renders an event for the expected-sequence comparison.
func describeEvent(ev api.SandboxEvent) string {
	switch {
	case ev.Type == api.EventRunStarted:
		return "run.started " + ev.Run.Command
	case ev.Type == api.EventRunEnded:
		code := ""
		if ev.Run.ExitCode != nil {
			code = " " + strconv.Itoa(*ev.Run.ExitCode)
		}
		return "run.ended " + ev.Run.Outcome + code
	case ev.File != nil:
		return "file " + ev.File.Change + " " + ev.File.Path
	case ev.Package != nil:
		return fmt.Sprintf("package %s %s %s %s", ev.Package.Manager, ev.Package.Action, ev.Package.Name, ev.Package.Version)
	case ev.Egress != nil:
		return "network " + ev.Egress.Decision + " " + ev.Egress.Destination
	case ev.Transition != nil:
		return "transition " + ev.Transition.From + ">" + ev.Transition.To + " " + ev.Cause
	default:
		return ev.Type
	}
}

// TestFlightRecorder runs a scripted agent workload against the real
// daemon and checks its flight record: exactly the expected events in
// order, each effect linked to its run; a canary secret in no event or
// export; and `agentbox audit verify` catching an edited, a deleted and a
// reordered record and a truncated tail of the stored file.
func TestFlightRecorder(t *testing.T) {
	dir := t.TempDir()
	up := startUpstreams(t, dir)
	d := newDaemon(t)
	if code, body := d.rawRequest(t, "PUT", "/v1/secrets/canary", []byte(auditCanary)); code != 200 {
		t.Fatalf("storing secret: %d %s", code, body)
	}
	hp := strconv.Itoa(up.httpPort)
	sb := d.create(t, agentbox.SandboxSpec{Network: &api.NetworkSpec{
		Mode:  api.NetworkEgress,
		Allow: []string{"good.test:" + hp},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start, err := sb.QueryEvents(ctx, agentbox.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	after := start[len(start)-1].Seq

	// The workload.
	mustRun(t, sb, "echo hello > /root/notes.txt && mkdir /root/src && echo 'print(1)' > /root/src/app.py")
	if res := run(t, sb, "cat /root/missing.txt"); res.ExitCode == 0 {
		t.Fatal("cat of a missing file succeeded")
	}
	mustRun(t, sb, "wget -q -O /dev/null http://good.test:"+hp+"/plain")
	if res := run(t, sb, "wget -q -O /dev/null http://denied.test:"+hp+"/"); res.ExitCode == 0 {
		t.Fatal("a denied destination was reached")
	}
	out := mustRun(t, sb, "echo token=$CANARY; echo $CANARY | wc -c > /root/len.txt", agentbox.WithSecret("canary", "CANARY"))
	if strings.Contains(out, auditCanary) {
		t.Fatal("the canary reached the caller")
	}
	// A package "installed" the way pip and dpkg leave them (the busybox
	// template has neither tool): a dist-info directory and a dpkg file
	// list with its status entry.
	mustRun(t, sb, "mkdir -p /usr/lib/python3/dist-packages/leftpad-1.2.0.dist-info /var/lib/dpkg/info && "+
		"touch /var/lib/dpkg/info/cowsay.list && printf 'Package: cowsay\\nStatus: install ok installed\\nVersion: 3.03-1\\n\\n' > /var/lib/dpkg/status")
	if _, err := sb.Checkpoint(ctx, "cp1"); err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "rm /root/notes.txt && echo changed >> /etc/group")
	if _, err := sb.Restore(ctx, "cp1"); err != nil {
		t.Fatal(err)
	}
	forks, err := sb.Fork(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = forks[0].Delete(context.Background()) })

	evs, err := sb.QueryEvents(ctx, agentbox.EventQuery{After: after})
	if err != nil {
		t.Fatal(err)
	}
	// Network events are recorded when the proxy finishes the connection,
	// which may be after their run's end: they are checked by their run,
	// apart from the sequence.
	var got []string
	var network []api.SandboxEvent
	runOf := map[string]string{} // run id -> command
	for _, ev := range evs {
		if ev.Type == api.EventRunStarted {
			runOf[ev.RunID] = ev.Run.Command
		}
		if ev.Type == api.EventNetwork {
			network = append(network, ev)
			continue
		}
		got = append(got, describeEvent(ev))
	}
	want := []string{
		"run.started echo hello > /root/notes.txt && mkdir /root/src && echo 'print(1)' > /root/src/app.py",
		"file created /root/notes.txt",
		"file created /root/src",
		"file created /root/src/app.py",
		"run.ended ok 0",
		"run.started cat /root/missing.txt",
		"run.ended nonzero 1",
		"run.started wget -q -O /dev/null http://good.test:" + hp + "/plain",
		"run.ended ok 0",
		"run.started wget -q -O /dev/null http://denied.test:" + hp + "/",
		"run.ended nonzero 1",
		"run.started echo token=$CANARY; echo $CANARY | wc -c > /root/len.txt",
		"file created /root/len.txt",
		"run.ended ok 0",
		"run.started mkdir -p /usr/lib/python3/dist-packages/leftpad-1.2.0.dist-info /var/lib/dpkg/info && touch /var/lib/dpkg/info/cowsay.list && printf 'Package: cowsay\\nStatus: install ok installed\\nVersion: 3.03-1\\n\\n' > /var/lib/dpkg/status",
		"file created /usr/lib",
		"file created /usr/lib/python3",
		"file created /usr/lib/python3/dist-packages",
		"file created /usr/lib/python3/dist-packages/leftpad-1.2.0.dist-info",
		"file created /var/lib",
		"file created /var/lib/dpkg",
		"file created /var/lib/dpkg/info",
		"file created /var/lib/dpkg/info/cowsay.list",
		"file created /var/lib/dpkg/status",
		"package pip installed leftpad 1.2.0",
		"package dpkg installed cowsay 3.03-1",
		"run.ended ok 0",
		"transition running>running checkpoint",
		"checkpoint",
		"run.started rm /root/notes.txt && echo changed >> /etc/group",
		"file modified /etc/group",
		"file deleted /root/notes.txt",
		"run.ended ok 0",
		"transition running>running restore",
		"restore",
		"transition running>running checkpoint", // the fork's implicit checkpoint
		"fork",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\n\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Every effect names its run.
	for _, ev := range evs {
		if ev.File == nil && ev.Package == nil {
			continue
		}
		if _, ok := runOf[ev.RunID]; !ok {
			t.Errorf("event %d (%s) names run %q, not a run of the workload", ev.Seq, describeEvent(ev), ev.RunID)
		}
	}
	if len(network) != 2 {
		t.Fatalf("network events: %+v", network)
	}
	for _, ev := range network {
		want := "good.test"
		if ev.Egress.Decision == api.EgressDenied {
			want = "denied.test"
		}
		if cmd := runOf[ev.RunID]; !strings.Contains(cmd, want) {
			t.Errorf("network event %s is linked to run %q (%q)", describeEvent(ev), ev.RunID, cmd)
		}
	}
	decisions := network[0].Egress.Decision + "," + network[1].Egress.Decision
	if decisions != "allowed,denied" {
		t.Errorf("network decisions %s", decisions)
	}
	// The secret's name is recorded, its value nowhere.
	for _, ev := range evs {
		if ev.Type == api.EventRunStarted && strings.Contains(ev.Run.Command, "CANARY") {
			if strings.Join(ev.Run.Credentials, ",") != "canary" {
				t.Errorf("credentials of the secret run: %v", ev.Run.Credentials)
			}
		}
	}
	// The fork's own record starts with its create.
	fevs, err := forks[0].QueryEvents(ctx, agentbox.EventQuery{Types: []string{api.EventCreate}})
	if err != nil || len(fevs) != 1 || !strings.Contains(fevs[0].Detail, "fork of") {
		t.Fatalf("fork's create: %+v %v", fevs, err)
	}

	// The CLI: events, export, follow; the canary in none of it.
	var export bytes.Buffer
	if err := sb.ExportEvents(ctx, agentbox.EventQuery{}, &export); err != nil {
		t.Fatal(err)
	}
	table := auditCLI(t, d, "events", sb.ID())
	jsonOut := auditCLI(t, d, "--json", "events", sb.ID(), "--kind", "run")
	for what, s := range map[string]string{"export": export.String(), "table": table, "json": jsonOut} {
		if strings.Contains(s, auditCanary) {
			t.Errorf("the canary is in the %s", what)
		}
	}
	if !strings.Contains(export.String(), "[REDACTED:canary]") {
		t.Error("the secret run's excerpt was not recorded redacted")
	}
	var list api.SandboxEventList
	if err := json.Unmarshal([]byte(jsonOut), &list); err != nil || len(list.Events) < 14 {
		t.Fatalf("--json --kind run: %v %d", err, len(list.Events))
	}
	// Follow sees a new run as it happens.
	fs, err := sb.FollowEvents(ctx, agentbox.EventQuery{Types: []string{"run"}, After: evs[len(evs)-1].Seq})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "true")
	if ev, err := fs.Next(); err != nil || ev.Type != api.EventRunStarted || ev.Run.Command != "true" {
		t.Fatalf("followed %+v %v", ev, err)
	}
	fs.Close()

	// Verification: intact, then every kind of tampering detected.
	if out := auditCLI(t, d, "audit", "verify", sb.ID()); !strings.Contains(out, "ok") {
		t.Fatalf("audit verify: %s", out)
	}
	if err := d.client.Sandbox(sb.ID()).Delete(ctx); err != nil {
		t.Fatal(err)
	}
	// Deleted: the record is finished, signed and kept.
	if out := auditCLI(t, d, "audit", "verify", sb.ID()); !strings.Contains(out, "(deleted)") || !strings.Contains(out, "ok") {
		t.Fatalf("audit verify of the deleted sandbox: %s", out)
	}
	logPath := filepath.Join(d.dataDir, "audit", sb.ID(), "log.jsonl")
	orig, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(orig, []byte("\n"))
	lines = lines[:len(lines)-1]
	for name, tampered := range map[string][]byte{
		"edit":     bytes.Replace(orig, []byte("cat /root/missing.txt"), []byte("cat /root/innocent.txt"), 1),
		"delete":   bytes.Join(append(append([][]byte{}, lines[:5]...), lines[6:]...), nil),
		"reorder":  bytes.Join(append(append(append([][]byte{}, lines[:5]...), lines[6], lines[5]), lines[7:]...), nil),
		"truncate": bytes.Join(lines[:len(lines)-3], nil),
	} {
		if bytes.Equal(tampered, orig) {
			t.Fatalf("%s: nothing changed", name)
		}
		if err := os.WriteFile(logPath, tampered, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := auditCLIErr(d, "audit", "verify", sb.ID())
		if err == nil || !strings.Contains(out, "FAILED") {
			t.Errorf("%s not detected: %v\n%s", name, err, out)
		} else {
			t.Logf("%s: %s", name, strings.TrimSpace(out))
		}
	}
	if err := os.WriteFile(logPath, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := auditCLI(t, d, "audit", "verify"); !strings.Contains(out, sb.ID()) {
		t.Fatalf("audit verify (all): %s", out)
	}
}

// cliErr runs the agentbox CLI against d and returns its output and error.
func auditCLIErr(d *daemon, args ...string) (string, error) {
	cmd := exec.Command(agentboxBin(d.t), append([]string{"--host", "unix://" + d.socket}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// cli runs the agentbox CLI against d and fails the test on an error.
func auditCLI(t *testing.T, d *daemon, args ...string) string {
	t.Helper()
	out, err := auditCLIErr(d, args...)
	if err != nil {
		t.Fatalf("agentbox %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// The record survives daemon restarts, a clean one and a crash: the chain
// continues and verifies.
func TestFlightRecorderAcrossRestarts(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "echo one > /root/one.txt")
	d.restart(syscall.SIGTERM)
	mustRun(t, sb, "echo two > /root/two.txt")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A query waits for the run's effects to be recorded: a crash right
	// after an exit loses them otherwise (docs/AUDIT.md).
	if _, err := d.client.Sandbox(sb.ID()).QueryEvents(ctx, agentbox.EventQuery{Limit: 1}); err != nil {
		t.Fatal(err)
	}
	d.restart(syscall.SIGKILL)
	mustRun(t, sb, "echo three > /root/three.txt")
	evs, err := d.client.Sandbox(sb.ID()).QueryEvents(ctx, agentbox.EventQuery{Types: []string{api.EventFileChanged}})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, ev := range evs {
		paths = append(paths, ev.File.Path)
	}
	if strings.Join(paths, ",") != "/root/one.txt,/root/two.txt,/root/three.txt" {
		t.Fatalf("files across restarts: %v", paths)
	}
	res, err := d.client.Sandbox(sb.ID()).VerifyAudit(ctx)
	if err != nil || !res.OK {
		t.Fatalf("verify after restarts: %+v %v", res, err)
	}
}
