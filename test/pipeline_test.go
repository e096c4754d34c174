package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
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

// cliRun runs the agentbox binary against d's unix socket.
func cliRun(t *testing.T, d *daemon, args ...string) string {
	t.Helper()
	cmd := exec.Command(agentboxBin(t), args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("agentbox %v: %v\n%s%s", args, err, out, stderr)
	}
	return string(out)
}

// runOf returns the newest run of sandbox whose command line contains
// marker.
func runOf(t *testing.T, c *agentbox.Client, sandbox, marker string) agentbox.Run {
	t.Helper()
	runs, err := c.Runs(context.Background(), agentbox.RunQuery{Sandbox: sandbox})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if strings.Contains(r.Command+" "+strings.Join(r.Cmd, " "), marker) {
			return r
		}
	}
	t.Fatalf("no run of %q in sandbox %s among %d", marker, sandbox, len(runs))
	return agentbox.Run{}
}

// checkRunShape asserts a finished run record has every field a run record
// must have, whatever its trigger.
func checkRunShape(t *testing.T, r agentbox.Run, trigger, whoPrefix string) {
	t.Helper()
	b, _ := json.Marshal(r)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	for _, k := range []string{"id", "trigger", "who", "tenant", "template", "sandbox", "state", "exit_code", "started_at", "ended_at", "duration_seconds", "usage"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s run lacks %q: %s", trigger, k, b)
		}
	}
	usage, _ := m["usage"].(map[string]any)
	for _, k := range []string{"cpu_seconds", "memory_gb_seconds", "egress_bytes"} {
		if _, ok := usage[k]; !ok {
			t.Errorf("%s run usage lacks %q: %s", trigger, k, b)
		}
	}
	if r.Trigger != trigger || !strings.HasPrefix(r.Who, whoPrefix) || r.Tenant != "admin" || r.Template != "busybox" ||
		r.State != api.RunFinished || r.ExitCode == nil || *r.ExitCode != 0 || r.EndedAt == nil || r.EndedAt.Before(r.StartedAt) ||
		r.Usage.MemoryGBSeconds <= 0 {
		t.Errorf("%s run: %s", trigger, b)
	}
}

// TestPipelineSameRunRecordFromEveryTrigger: an exec through the API (SDK
// on the socket, SDK over TCP with a key), through the CLI, a schedule and
// a webhook all go through one pipeline and leave records of one shape.
func TestPipelineSameRunRecordFromEveryTrigger(t *testing.T) {
	d, addr, key := tcpDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})

	// API, unix socket.
	mustRun(t, sb, "echo via-sdk")
	checkRunShape(t, runOf(t, d.client, sb.ID(), "via-sdk"), api.TriggerAPI, "unix-socket")

	// API over TCP: the caller is the key's id, never the key.
	tc, _ := agentbox.New(agentbox.WithHost("http://"+addr), agentbox.WithAPIKey(key))
	tsb, err := tc.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, tsb, "echo via-tcp")
	r := runOf(t, d.client, sb.ID(), "via-tcp")
	checkRunShape(t, r, api.TriggerAPI, "api-key:")
	if strings.Contains(r.Who, key) {
		t.Fatalf("the key is in the record: %s", r.Who)
	}

	// The CLI (the agentbox binary, as users run it).
	if out := cliRun(t, d, "exec", sb.ID(), "--", "echo", "via-cli"); out != "via-cli\n" {
		t.Fatalf("cli exec: %q", out)
	}
	checkRunShape(t, runOf(t, d.client, sb.ID(), "via-cli"), api.TriggerAPI, "unix-socket")
	if out := cliRun(t, d, "runs", "--sandbox", sb.ID()); !strings.Contains(out, "via-cli") || !strings.Contains(out, "via-tcp") {
		t.Fatalf("agentbox runs:\n%s", out)
	}

	// A schedule, created with the CLI and fired by its trigger route (the
	// code path of a cron slot; the slot timing itself is unit-tested with
	// a fake clock in internal/pipeline). Each run gets a fresh sandbox,
	// deleted after it.
	sid := strings.TrimSpace(cliRun(t, d, "schedule", "create", "--cron", "0 9 * * 1", "--tz", "Europe/Paris", "--template", "busybox", "--", "echo via-schedule; hostname"))
	sc, err := d.client.Schedule(ctx, sid)
	if err != nil || sc.NextRunAt == nil || sc.Timezone != "Europe/Paris" {
		t.Fatalf("schedule %+v %v", sc, err)
	}
	if l := sc.NextRunAt.In(mustLoc(t, "Europe/Paris")); l.Weekday() != time.Monday || l.Hour() != 9 || l.Minute() != 0 {
		t.Fatalf("next run %s is not Monday 09:00 in Paris", l)
	}
	sr, err := d.client.TriggerSchedule(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	checkRunShape(t, sr, api.TriggerSchedule, "schedule:"+sid)
	if !strings.HasPrefix(string(sr.Output), "via-schedule\n") {
		t.Fatalf("schedule output %q", sr.Output)
	}
	if _, err := d.client.Get(ctx, sr.Sandbox); !agentbox.IsNotFound(err) {
		t.Fatalf("the schedule run's fresh sandbox is still there: %v", err)
	}

	// A webhook, delivered over TCP with no API key: the signature is the
	// authentication. The body is the command's stdin.
	hk, err := d.client.CreateHook(ctx, agentbox.RunAction{Template: "busybox", Command: `echo "via-webhook $AGENTBOX_HOOK_ID"; cat`})
	if err != nil || hk.Secret == "" {
		t.Fatalf("hook %+v %v", hk, err)
	}
	anon, _ := agentbox.New(agentbox.WithHost("http://" + addr))
	body := []byte(`{"ref":"refs/heads/main"}`)
	hr, err := anon.DeliverHook(ctx, hk.ID, hk.Secret, body, true)
	if err != nil {
		t.Fatalf("signed delivery over TCP without a key: %v", err)
	}
	checkRunShape(t, hr, api.TriggerWebhook, "hook:"+hk.ID)
	if want := "via-webhook " + hk.ID + "\n" + string(body); string(hr.Output) != want {
		t.Fatalf("webhook output %q, want %q", hr.Output, want)
	}
	// The four kinds of records are all in one list.
	all, err := d.client.Runs(ctx, agentbox.RunQuery{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range all {
		seen[r.Trigger] = true
	}
	if !seen[api.TriggerAPI] || !seen[api.TriggerSchedule] || !seen[api.TriggerWebhook] {
		t.Fatalf("triggers listed: %v", seen)
	}
	if got, err := d.client.Runs(ctx, agentbox.RunQuery{Trigger: api.TriggerWebhook}); err != nil || len(got) != 1 || got[0].ID != hr.ID {
		t.Fatalf("runs of trigger webhook: %v %v", got, err)
	}
}

// TestPipelineWebhookRejections: bad signatures, replays and stale
// timestamps are refused before anything runs.
func TestPipelineWebhookRejections(t *testing.T) {
	d, addr, _ := tcpDaemon(t)
	ctx := context.Background()
	hk, err := d.client.CreateHook(ctx, agentbox.RunAction{Template: "busybox", Command: "cat"})
	if err != nil {
		t.Fatal(err)
	}
	anon, _ := agentbox.New(agentbox.WithHost("http://" + addr))
	body := []byte("payload")
	now := time.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	sig := agentbox.SignHook(hk.Secret, now, body)
	for name, c := range map[string]struct{ ts, sig string }{
		"wrong secret":    {ts, agentbox.SignHook("whsec_guess", now, body)},
		"no signature":    {ts, ""},
		"other timestamp": {strconv.FormatInt(now-1, 10), sig},
		"stale":           {strconv.FormatInt(now-400, 10), agentbox.SignHook(hk.Secret, now-400, body)},
		"future":          {strconv.FormatInt(now+400, 10), agentbox.SignHook(hk.Secret, now+400, body)},
	} {
		if _, err := anon.DeliverHookSigned(ctx, hk.ID, c.ts, c.sig, body, true); !agentbox.IsUnauthenticated(err) {
			t.Errorf("%s: %v, want 401", name, err)
		}
	}
	// An unknown hook looks the same as a bad signature.
	if _, err := anon.DeliverHookSigned(ctx, "hook_00000000000000000000", ts, sig, body, true); !agentbox.IsUnauthenticated(err) {
		t.Errorf("unknown hook: %v", err)
	}
	if runs, _ := d.client.Runs(ctx, agentbox.RunQuery{Trigger: api.TriggerWebhook}); len(runs) != 0 {
		t.Fatalf("rejected deliveries ran: %+v", runs)
	}
	// The genuine delivery runs once; its replay is refused.
	if _, err := anon.DeliverHookSigned(ctx, hk.ID, ts, sig, body, true); err != nil {
		t.Fatal(err)
	}
	if _, err := anon.DeliverHookSigned(ctx, hk.ID, ts, sig, body, true); !agentbox.IsConflict(err) {
		t.Fatalf("replay: %v, want 409", err)
	}
	if runs, _ := d.client.Runs(ctx, agentbox.RunQuery{Trigger: api.TriggerWebhook}); len(runs) != 1 {
		t.Fatalf("runs after a replay: %d", len(runs))
	}
	// The management routes still need a key over TCP.
	if _, err := anon.Hooks(ctx); !agentbox.IsUnauthenticated(err) {
		t.Fatalf("listing hooks without a key: %v", err)
	}
	// The secret is not in the store in the clear.
	if db, err := os.ReadFile(filepath.Join(d.dataDir, "meta.db")); err != nil || bytes.Contains(db, []byte(hk.Secret)) {
		t.Fatalf("hook secret in meta.db in the clear (or unreadable: %v)", err)
	}
}

// TestPipelineUsageGrowsAfterCPUBurn: a run that burns CPU is metered in its
// record, in the usage sums and in the export; schedules and records
// survive a daemon restart.
func TestPipelineUsageGrowsAfterCPUBurn(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "true")
	before, err := d.client.Usage(ctx, sb.ID(), time.Time{})
	if err != nil || len(before.Sandboxes) != 1 {
		t.Fatalf("usage before: %+v %v", before, err)
	}
	mustRun(t, sb, `end=$(( $(date +%s) + 2 )); while [ $(date +%s) -lt $end ]; do :; done; echo burnt`)
	r := runOf(t, d.client, sb.ID(), "burnt")
	if r.Usage.CPUSeconds < 0.5 || r.DurationSeconds < 1 || r.Usage.MemoryGBSeconds <= 0 {
		t.Fatalf("burn run usage: %+v (%.2fs)", r.Usage, r.DurationSeconds)
	}
	var after api.Usage
	if err := json.Unmarshal([]byte(cliRun(t, d, "usage", "--json", "--sandbox", sb.ID())), &after); err != nil {
		t.Fatal(err)
	}
	b, a := before.Sandboxes[0].Totals, after.Sandboxes[0].Totals
	if a.Runs != b.Runs+1 || a.CPUSeconds < b.CPUSeconds+0.5 || a.ByTrigger[api.TriggerAPI].Runs != a.Runs {
		t.Fatalf("usage before %+v after %+v", b, a)
	}
	if len(after.Tenants) != 1 || after.Tenants[0].Tenant != "admin" || after.Tenants[0].Totals.CPUSeconds < a.CPUSeconds {
		t.Fatalf("tenant usage %+v", after.Tenants)
	}
	// The export: one JSON line per run.
	found := false
	sc := bufio.NewScanner(strings.NewReader(cliRun(t, d, "usage", "--export", "--sandbox", sb.ID())))
	lines := 0
	for sc.Scan() {
		var rec api.UsageRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		lines++
		if rec.Run == r.ID {
			found = rec.CPUSeconds == r.Usage.CPUSeconds && rec.Trigger == api.TriggerAPI
		}
	}
	if lines != int(a.Runs) || !found {
		t.Fatalf("export: %d lines for %d runs, burn run found: %v", lines, a.Runs, found)
	}
	// Records and schedules are durable.
	s, err := d.client.CreateSchedule(ctx, agentbox.CreateScheduleRequest{Cron: "@daily", RunAction: agentbox.RunAction{Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	d.restart(syscall.SIGTERM)
	if got, err := d.client.Run(ctx, r.ID); err != nil || got.Usage != r.Usage {
		t.Fatalf("run after restart: %+v %v", got, err)
	}
	if got, err := d.client.Schedule(ctx, s.ID); err != nil || !got.NextRunAt.Equal(*s.NextRunAt) {
		t.Fatalf("schedule after restart: %+v %v", got, err)
	}
	if out := cliRun(t, d, "schedule", "rm", s.ID); strings.TrimSpace(out) != s.ID {
		t.Fatalf("schedule rm: %q", out)
	}
	if _, err := d.client.Schedule(ctx, s.ID); !agentbox.IsNotFound(err) {
		t.Fatalf("deleted schedule: %v", err)
	}
}

// TestPipelineScheduleNamedSandbox: a schedule with a name and the
// persistent lifecycle runs every time in the same sandbox, which keeps
// what earlier runs left.
func TestPipelineScheduleNamedSandbox(t *testing.T) {
	d := newDaemon(t)
	sid := strings.TrimSpace(cliRun(t, d, "schedule", "create", "--cron", "*/5 * * * *", "--template", "busybox",
		"--name", "nightly-"+randHex(3), "--lifecycle", "persistent", "--", "touch /root/run-$AGENTBOX_RUN_ID; ls /root | wc -l"))
	var r1, r2 api.Run
	if err := json.Unmarshal([]byte(cliRun(t, d, "--json", "schedule", "trigger", sid)), &r1); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(cliRun(t, d, "--json", "schedule", "trigger", sid)), &r2); err != nil {
		t.Fatal(err)
	}
	if r1.Sandbox == "" || r1.Sandbox != r2.Sandbox || strings.TrimSpace(string(r1.Output)) != "1" || strings.TrimSpace(string(r2.Output)) != "2" {
		t.Fatalf("runs: %s %q, %s %q", r1.Sandbox, r1.Output, r2.Sandbox, r2.Output)
	}
	if _, err := d.client.Get(context.Background(), r1.Sandbox); err != nil {
		t.Fatalf("the named sandbox is gone: %v", err)
	}
}

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestPipelineRunIDIsTheTokenRun: the run id a command sees, the run id in
// its bridge token (which egress records and bridge events carry) and the
// run record's id are one id.
func TestPipelineRunIDIsTheTokenRun(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	out := mustRun(t, sb, `echo "$AGENTBOX_RUN_ID"; echo "$AGENTBOX_RUN_TOKEN" | cut -d. -f2`, agentbox.WithRunToken())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "run_") {
		t.Fatalf("output %q", out)
	}
	payload, err := base64.RawURLEncoding.DecodeString(lines[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Run string `json:"run"`
		JTI string `json:"jti"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.Run != lines[0] || claims.JTI != lines[0] {
		t.Fatalf("token run %q / %q, env run %q", claims.Run, claims.JTI, lines[0])
	}
	r, err := d.client.Run(context.Background(), lines[0])
	if err != nil || r.Sandbox != sb.ID() || r.Trigger != api.TriggerAPI {
		t.Fatalf("record of the token's run: %+v %v", r, err)
	}
}
