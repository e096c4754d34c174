package test

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Issue 17, findings 4, 6, 7 and 8: merge of sibling forks, rollback,
// implicit checkpoint retention, transitions and sleeping sources.

// identityPaths are the files every fork gets fresh (its identity).
var identityPaths = []string{"/etc/machine-id", "/var/lib/systemd/random-seed"}

// TestMergeSiblingForks: two forks of one checkpoint each get a fresh
// identity, which is no change of theirs: diff leaves the identity files
// out and a merge of one sibling into the other applies the other's work
// without a conflict (include_identity brings them back). A real conflict
// through the CLI exits 1, as merge's help says, and lists the path.
func TestMergeSiblingForks(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	parent := d.create(t, agentbox.SandboxSpec{Template: "busybox"})
	mustRun(t, parent, "mkdir -p /root/proj && echo base > /root/proj/shared.txt")
	forks, err := parent.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	a, b := forks[0], forks[1]
	if ida, idb := mustRun(t, a, "cat /etc/machine-id"), mustRun(t, b, "cat /etc/machine-id"); ida == idb {
		t.Fatalf("siblings share a machine id %q", ida)
	}
	mustRun(t, a, "echo from-a > /root/proj/a.txt")
	mustRun(t, b, "echo from-b > /root/proj/b.txt")

	df, err := d.client.Diff(ctx, "sandbox:"+a.ID(), "sandbox:"+b.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	ch := changesByPath(df)
	for _, p := range identityPaths {
		if _, ok := ch[p]; ok {
			t.Errorf("diff of siblings shows their identity file %s", p)
		}
	}
	wantChange(t, ch, "/root/proj/a.txt", api.ChangeDeleted)
	wantChange(t, ch, "/root/proj/b.txt", api.ChangeAdded)
	// The option includes them.
	code, body := d.rawRequest(t, "GET", "/v1/diff?"+url.Values{"from": {"sandbox:" + a.ID()}, "to": {"sandbox:" + b.ID()}, "include_identity": {"true"}}.Encode(), nil)
	var full api.Diff
	if code != 200 || json.Unmarshal(body, &full) != nil {
		t.Fatalf("diff with include_identity: %d %s", code, body)
	}
	if _, ok := changesByPath(full)["/etc/machine-id"]; !ok {
		t.Errorf("diff with include_identity lacks /etc/machine-id: %s", body)
	}

	res, err := b.Merge(ctx, a.ID(), agentbox.MergeOptions{})
	if err != nil {
		t.Fatalf("merging sibling forks: %v", err)
	}
	for _, c := range res.Applied {
		for _, p := range identityPaths {
			if c.Path == p {
				t.Errorf("merge applied the source's identity file %s", p)
			}
		}
	}
	if got := mustRun(t, b, "cat /root/proj/a.txt /root/proj/b.txt"); got != "from-a\nfrom-b\n" {
		t.Fatalf("after the merge: %q", got)
	}
	if ida, idb := mustRun(t, a, "cat /etc/machine-id"), mustRun(t, b, "cat /etc/machine-id"); ida == idb {
		t.Fatal("the merge copied the source's machine id")
	}
	// With include_identity the identity files conflict again.
	code, body = d.rawRequest(t, "POST", "/v1/sandboxes/"+b.ID()+"/merge",
		[]byte(`{"from":"`+a.ID()+`","dry_run":true,"include_identity":true}`))
	if code != 409 || !strings.Contains(string(body), "/etc/machine-id") {
		t.Errorf("merge with include_identity: %d %s", code, body)
	}

	// A conflict through the CLI: exit status 1, the path listed.
	mustRun(t, a, "echo a-version > /root/proj/shared.txt")
	mustRun(t, b, "echo b-version > /root/proj/shared.txt")
	out, errOut, code := d.cli(t, "merge", a.ID(), b.ID())
	if code != 1 || !strings.Contains(out, "/root/proj/shared.txt") {
		t.Fatalf("merge with a conflict: exit %d, stdout %q, stderr %q; want 1 and the path", code, out, errOut)
	}
}

// TestRollbackKeepsOtherProcesses: a failed transactional exec rolls the
// files back without killing a process the transaction did not start.
func TestRollbackKeepsOtherProcesses(t *testing.T) {
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "echo 1 > /root/x")
	srv, err := sb.Start(ctx, api.ExecRequest{Command: "while true; do sleep 1; done"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(ctx, "echo 2 > /root/x; echo new > /root/y; rm /bin/ls; false", agentbox.WithRollbackOnFailure())
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 1 || !res.RolledBack {
		t.Fatalf("failed command: %+v", res)
	}
	if out := mustRun(t, sb, "cat /root/x; ls /bin/ls; test -e /root/y || echo no-y"); out != "1\n/bin/ls\nno-y\n" {
		t.Fatalf("after rollback: %q", out)
	}
	ps, err := sb.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alive := false
	for _, p := range ps {
		if p.Pid == srv.Pid() && p.Running {
			alive = true
		}
	}
	if !alive {
		t.Fatalf("the rollback killed process %d the transaction did not start: %+v", srv.Pid(), ps)
	}
}

// implicitCheckpoint is a checkpoint as the API lists it, with the
// retention fields.
type implicitCheckpoint struct {
	ID        string            `json:"id"`
	Labels    map[string]string `json:"labels"`
	Implicit  string            `json:"implicit"`
	ExpiresAt *time.Time        `json:"expires_at"`
}

func listCheckpointsRaw(t *testing.T, d *daemon, id string) []implicitCheckpoint {
	t.Helper()
	code, body := d.rawRequest(t, "GET", "/v1/sandboxes/"+id+"/checkpoints", nil)
	var list struct {
		Checkpoints []implicitCheckpoint `json:"checkpoints"`
	}
	if code != 200 || json.Unmarshal(body, &list) != nil {
		t.Fatalf("listing checkpoints: %d %s", code, body)
	}
	return list.Checkpoints
}

// TestImplicitCheckpointRetention: the checkpoints the daemon takes on its
// own (exec --checkpoint, fork, merge) are kept up to a count per sandbox
// and an age, are listed as implicit with their expiry, and one a live fork
// runs on is never pruned; checkpoints the user asked for are kept.
func TestImplicitCheckpointRetention(t *testing.T) {
	d := newDaemonWith(t, "--implicit-checkpoints-keep", "2", "--implicit-checkpoints-max-age-seconds", "3600")
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	mine, err := sb.Checkpoint(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	forks, err := sb.Fork(ctx, 1) // an implicit "fork" checkpoint, which the fork runs on
	if err != nil {
		t.Fatal(err)
	}
	var execs []string
	for i := range 4 {
		res, err := sb.Run(ctx, "echo "+string(rune('a'+i))+" > /root/x", agentbox.WithCheckpoint())
		if err != nil || res.Checkpoint == "" {
			t.Fatalf("exec --checkpoint: %+v %v", res, err)
		}
		execs = append(execs, res.Checkpoint)
	}
	cks := listCheckpointsRaw(t, d, sb.ID())
	got := map[string]implicitCheckpoint{}
	for _, c := range cks {
		got[c.ID] = c
	}
	if c, ok := got[mine.ID]; !ok || c.Implicit != "" || c.ExpiresAt != nil {
		t.Errorf("the user's checkpoint: %+v (present %v)", c, ok)
	}
	for _, old := range execs[:2] {
		if _, ok := got[old]; ok {
			t.Errorf("old implicit checkpoint %s was kept past the count", old)
		}
	}
	for _, recent := range execs[2:] {
		c, ok := got[recent]
		if !ok {
			t.Fatalf("recent implicit checkpoint %s was pruned: %+v", recent, cks)
		}
		if c.Implicit != "exec" || c.ExpiresAt == nil || c.ExpiresAt.Before(time.Now().Add(50*time.Minute)) {
			t.Errorf("implicit checkpoint %s: %+v; want implicit exec expiring in about an hour", recent, c)
		}
	}
	forkCk := ""
	for _, c := range cks {
		if c.Labels["agentbox.implicit"] == "fork" {
			forkCk = c.ID
		}
	}
	if forkCk == "" {
		t.Fatalf("the fork's checkpoint was pruned while the fork runs on it: %+v", cks)
	}
	if out := mustRun(t, forks[0], "echo ok"); out != "ok\n" {
		t.Fatal(out)
	}
	// checkpoint ls shows which checkpoints are implicit.
	out, errOut, code := d.cli(t, "checkpoint", "ls", sb.ID())
	if code != 0 || !strings.Contains(out, "IMPLICIT") || !strings.Contains(out, "EXPIRES") {
		t.Errorf("checkpoint ls: exit %d\n%s%s", code, out, errOut)
	}
}

// TestImplicitCheckpointMaxAge: an implicit checkpoint older than the
// maximum age goes without any further operation (the daemon's timer).
func TestImplicitCheckpointMaxAge(t *testing.T) {
	d := newDaemonWith(t, "--implicit-checkpoints-max-age-seconds", "1")
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	mine, err := sb.Checkpoint(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(ctx, "true", agentbox.WithCheckpoint())
	if err != nil || res.Checkpoint == "" {
		t.Fatalf("exec --checkpoint: %+v %v", res, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		cks := listCheckpointsRaw(t, d, sb.ID())
		if len(cks) == 1 && cks[0].ID == mine.ID {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the expired implicit checkpoint is still there: %+v", cks)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTransitionsRecordCheckpointRestore: checkpoint and restore show in
// the sandbox's transitions.
func TestTransitionsRecordCheckpointRestore(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	ck, err := sb.Checkpoint(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	ts, err := sb.Transitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	causes := map[string]bool{}
	for _, tr := range ts {
		causes[tr.Cause] = true
	}
	for _, want := range []string{"checkpoint", "restore"} {
		if !causes[want] {
			t.Errorf("transitions lack %s: %+v", want, ts)
		}
	}
}

// TestCheckpointKeepsSleepingSource: a checkpoint of a paused sandbox and a
// fork of a hibernated one leave the source as it was.
func TestCheckpointKeepsSleepingSource(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	for _, sleep := range []string{api.StatePaused, api.StateHibernated} {
		t.Run(sleep, func(t *testing.T) {
			sb := d.create(t, agentbox.SandboxSpec{Lifecycle: api.LifecyclePersistent})
			mustRun(t, sb, "echo kept > /root/f")
			var err error
			if sleep == api.StatePaused {
				err = sb.Pause(ctx)
			} else {
				err = sb.Hibernate(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			ck, err := sb.Checkpoint(ctx, "asleep")
			if err != nil {
				t.Fatal(err)
			}
			state := func() string {
				got, err := d.client.Get(ctx, sb.ID())
				if err != nil {
					t.Fatal(err)
				}
				return got.Info().State
			}
			if s := state(); s != sleep {
				t.Fatalf("after checkpoint: %s, want %s", s, sleep)
			}
			forks, err := d.client.Fork(ctx, ck.ID, 1)
			if err != nil {
				t.Fatal(err)
			}
			if out := mustRun(t, forks[0], "cat /root/f"); out != "kept\n" {
				t.Fatalf("fork of the checkpoint: %q", out)
			}
			forks, err = sb.Fork(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if s := state(); s != sleep {
				t.Fatalf("after fork: %s, want %s", s, sleep)
			}
			if out := mustRun(t, forks[0], "cat /root/f"); out != "kept\n" {
				t.Fatalf("fork of the sleeping sandbox: %q", out)
			}
			if out := mustRun(t, sb, "cat /root/f"); out != "kept\n" {
				t.Fatalf("the source after waking: %q", out)
			}
		})
	}
}

// TestTransitionsRecordUpgrade: an upgrade of the guest shows in the
// sandbox's transitions, with the versions.
func TestTransitionsRecordUpgrade(t *testing.T) {
	d := newDaemon(t)
	buildVariants(t, goodBuild)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{})
	res, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: goodBuild(t)})
	if err != nil || !res.Changed {
		t.Fatalf("upgrade: %+v %v", res, err)
	}
	ts, err := sb.Transitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ts {
		if tr.Cause == "upgrade" && tr.From == "running" && tr.To == "running" && strings.Contains(tr.Detail, "9.9.9-test+") {
			return
		}
	}
	t.Fatalf("transitions lack the upgrade: %+v", ts)
}

// TestDiffHibernatedSandbox: a hibernated sandbox's files are read on the
// host for a diff and a tree hash without waking it, and they are its
// files (its disk is mounted for the read), not an empty upper layer.
func TestDiffHibernatedSandbox(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Lifecycle: api.LifecyclePersistent})
	ck, err := sb.Checkpoint(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "echo new > /root/new.txt")
	awake, err := sb.TreeHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	df, err := d.client.Diff(ctx, "checkpoint:"+ck.ID, "sandbox:"+sb.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(df.Changes) != 1 || df.Changes[0].Path != "/root/new.txt" || df.Changes[0].Change != api.ChangeAdded {
		t.Fatalf("diff of the hibernated sandbox: %+v", df.Changes)
	}
	if h, err := sb.TreeHash(ctx); err != nil || h != awake {
		t.Fatalf("tree hash asleep %s (%v), awake %s", h, err, awake)
	}
	got, err := d.client.Get(ctx, sb.ID())
	if err != nil || got.Info().State != api.StateHibernated {
		t.Fatalf("after diff: %+v %v", got.Info(), err)
	}
}
