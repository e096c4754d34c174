package audit_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"crypto/ed25519"
	"crypto/rand"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/redact"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/sandboxtest"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/testutil"
)

const canary = "canary-7f3a9c1e55"

// newRecorder returns a Recorder whose runs walk their writable layer,
// or, with tracked, are followed by the change tracker (which needs
// root; the test fails if the tracker does not start).
func newRecorder(t *testing.T, tracked ...bool) (*audit.Recorder, *sandboxtest.Env, string) {
	t.Helper()
	return newRecorderWith(t, len(tracked) > 0 && tracked[0], nil)
}

// newRecorderWith is newRecorder with edit applied to the recorder's
// configuration.
func newRecorderWith(t *testing.T, tracked bool, edit func(*audit.Config)) (*audit.Recorder, *sandboxtest.Env, string) {
	t.Helper()
	track := ""
	if tracked {
		testutil.RequiresRoot(t)
		track = filepath.Join(t.TempDir(), "track")
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := audit.OpenStore(dir, key, audit.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := audit.Config{Store: st, TrackDir: track, Redactor: func(string) *redact.Redactor {
		return redact.New(map[string][]byte{"TOKEN": []byte(canary)})
	}}
	if edit != nil {
		edit(&cfg)
	}
	rec := audit.New(cfg)
	if on, _, _ := audit.TrackerStats(rec); on != (track != "") {
		t.Fatalf("change tracker on: %v, want %v", on, track != "")
	}
	e := sandboxtest.New(t, func(_ *sandboxtest.Env, c *sandbox.Config) {
		c.Extensions = append([]sandbox.Extension{rec}, c.Extensions...)
	})
	return rec, e, dir
}

func events(t *testing.T, rec *audit.Recorder, id string, q api.EventQuery) []api.SandboxEvent {
	t.Helper()
	evs, err := rec.Events(sandboxtest.Context(t), id, q)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// describe renders events compactly for comparison.
func describe(evs []api.SandboxEvent) []string {
	var out []string
	for _, ev := range evs {
		s := ev.Type
		switch {
		case ev.Run != nil && ev.Type == api.EventRunStarted:
			s += " " + ev.Run.Command
		case ev.Run != nil:
			s += " " + ev.Run.Outcome
		case ev.File != nil:
			s += " " + ev.File.Change + " " + ev.File.Path
		case ev.Package != nil:
			s += fmt.Sprintf(" %s %s %s %s", ev.Package.Manager, ev.Package.Action, ev.Package.Name, ev.Package.Version)
		case ev.Transition != nil:
			s += " " + ev.Transition.To + " " + ev.Cause
		}
		out = append(out, s)
	}
	return out
}

// bothWays runs test with runs walked and with runs tracked.
func bothWays(t *testing.T, test func(t *testing.T, tracked bool)) {
	t.Run("walked", func(t *testing.T) { test(t, false) })
	t.Run("tracked", func(t *testing.T) { test(t, true) })
}

func TestRecorderFollowsRuns(t *testing.T) { bothWays(t, testRecorderFollowsRuns) }

func testRecorderFollowsRuns(t *testing.T, tracked bool) {
	rec, e, _ := newRecorder(t, tracked)
	sb := e.Create(api.CreateSandboxRequest{})
	e.Write(sb.ID, "old.txt", "old")
	e.Write(sb.ID, "gone.txt", "bye")
	start := len(events(t, rec, sb.ID, api.EventQuery{}))
	cmd := `echo hello > new.txt; echo more >> old.txt; rm gone.txt; mkdir -p usr/lib/python3/dist-packages/requests-2.31.0.dist-info var/lib/dpkg/info; ` +
		`touch var/lib/dpkg/info/hello.list; printf 'Package: hello\nStatus: install ok installed\nVersion: 2.10-3\n\n' > var/lib/dpkg/status; echo ` + canary
	if r := e.Exec(sb.ID, api.ExecRequest{Command: cmd}); r.Code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	if r := e.Exec(sb.ID, api.ExecRequest{Command: "exit 3"}); r.Code != 3 {
		t.Fatalf("exit 3: %+v", r)
	}
	evs := events(t, rec, sb.ID, api.EventQuery{})[start:]
	got := describe(evs)
	want := []string{
		"run.started echo hello > new.txt; echo more >> old.txt; rm gone.txt; mkdir -p usr/lib/python3/dist-packages/requests-2.31.0.dist-info var/lib/dpkg/info; touch var/lib/dpkg/info/hello.list; printf 'Package: hello\\nStatus: install ok installed\\nVersion: 2.10-3\\n\\n' > var/lib/dpkg/status; echo [REDACTED:TOKEN]",
		"file.changed deleted /gone.txt",
		"file.changed created /new.txt",
		"file.changed modified /old.txt",
		"file.changed created /usr",
		"file.changed created /usr/lib",
		"file.changed created /usr/lib/python3",
		"file.changed created /usr/lib/python3/dist-packages",
		"file.changed created /usr/lib/python3/dist-packages/requests-2.31.0.dist-info",
		"file.changed created /var",
		"file.changed created /var/lib",
		"file.changed created /var/lib/dpkg",
		"file.changed created /var/lib/dpkg/info",
		"file.changed created /var/lib/dpkg/info/hello.list",
		"file.changed created /var/lib/dpkg/status",
		"package pip installed requests 2.31.0",
		"package dpkg installed hello 2.10-3",
		"run.ended ok",
		"run.started exit 3",
		"run.ended nonzero",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	run := evs[0].RunID
	for _, ev := range evs[:18] {
		if ev.RunID != run || run == "" {
			t.Fatalf("event %d (%s) has run %q, want %q", ev.Seq, ev.Type, ev.RunID, run)
		}
	}
	if evs[18].RunID == run {
		t.Fatal("two runs share a run id")
	}
	end := evs[17].Run
	if end.ExitCode == nil || *end.ExitCode != 0 || end.OutputSHA256 == "" || end.OutputBytes == 0 {
		t.Fatalf("run.ended: %+v", end)
	}
	if f := evs[2].File; f.Kind != "file" || f.Size != 6 || f.SHA256 != "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03" || f.Mode != "0644" {
		t.Fatalf("created file: %+v", f)
	}
	if code := evs[19].Run.ExitCode; code == nil || *code != 3 {
		t.Fatalf("exit code of the failing run: %v", code)
	}
	// Filters: by run, by type ("run" is both run types), by sequence.
	if n := len(events(t, rec, sb.ID, api.EventQuery{Run: run})); n != 18 {
		t.Errorf("run filter: %d events, want 18", n)
	}
	if n := len(events(t, rec, sb.ID, api.EventQuery{Types: []string{"run"}, After: evs[0].Seq - 1})); n != 4 {
		t.Errorf("type filter: %d events, want 4", n)
	}
	if n := len(events(t, rec, sb.ID, api.EventQuery{Types: []string{api.EventPackage}, Limit: 1})); n != 1 {
		t.Errorf("limit: %d events, want 1", n)
	}
	// The canary is in no event.
	b, _ := json.Marshal(events(t, rec, sb.ID, api.EventQuery{}))
	if strings.Contains(string(b), canary) {
		t.Fatal("the canary secret was recorded")
	}
	res, err := rec.Verify(sandboxtest.Context(t), sb.ID)
	if err != nil || !res.OK {
		t.Fatalf("verify: %+v %v", res, err)
	}
	if _, n, walked := audit.TrackerStats(rec); tracked && (n < 2 || walked != 0) {
		t.Fatalf("runs tracked %d, walked after lost events %d; want both runs tracked", n, walked)
	}
}

// Lifecycle operations and transitions are recorded with their cause;
// a deleted sandbox's record stays readable by its tenant only, ends with
// the delete, and verifies.
func TestRecorderLifecycleAndTenancy(t *testing.T) { bothWays(t, testRecorderLifecycleAndTenancy) }

func testRecorderLifecycleAndTenancy(t *testing.T, tracked bool) {
	rec, e, dir := newRecorder(t, tracked)
	ctx := tenant.WithPrincipal(sandboxtest.Context(t), tenant.Principal{Tenant: "acme", Scope: api.ScopeFull})
	sb, err := e.M.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.M.SetState(ctx, sb.ID, api.StatePaused); err != nil {
		t.Fatal(err)
	}
	other := tenant.WithPrincipal(sandboxtest.Context(t), tenant.Principal{Tenant: "other", Scope: api.ScopeFull})
	if _, err := rec.Events(other, sb.ID, api.EventQuery{}); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant reads the record: %v", err)
	}
	if err := e.M.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	evs, err := rec.Events(ctx, sb.ID, api.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(describe(evs), "\n")
	for _, w := range []string{"transition running create", "create", "transition paused api", "delete"} {
		if !strings.Contains(got, w) {
			t.Errorf("no %q in\n%s", w, got)
		}
	}
	if last := evs[len(evs)-1]; last.Type != api.EventDelete || last.Actor != "tenant:acme" || last.Tenant != "acme" {
		t.Errorf("last event %+v, want the delete by tenant:acme", last)
	}
	if _, err := rec.Events(other, sb.ID, api.EventQuery{}); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant reads the deleted record: %v", err)
	}
	res, err := rec.Verify(ctx, sb.ID)
	if err != nil || !res.OK || !res.Deleted {
		t.Fatalf("verify: %+v %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(dir, sb.ID, "deleted")); err != nil {
		t.Fatal(err)
	}
	all, err := rec.VerifyAll(other)
	if err != nil || len(all) != 0 {
		t.Fatalf("another tenant's VerifyAll: %+v %v", all, err)
	}
}

// Follow sends the recorded events, then new ones as they happen, and
// ends with the sandbox's delete.
func TestRecorderFollow(t *testing.T) { bothWays(t, testRecorderFollow) }

func testRecorderFollow(t *testing.T, tracked bool) {
	rec, e, _ := newRecorder(t, tracked)
	sb := e.Create(api.CreateSandboxRequest{})
	var mu sync.Mutex
	var got []api.SandboxEvent
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- rec.Follow(sandboxtest.Context(t), sb.ID, api.EventQuery{Types: []string{"run", api.EventDelete}}, func() { close(ready) }, func(ev api.SandboxEvent) error {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
			return nil
		})
	}()
	<-ready
	e.Exec(sb.ID, api.ExecRequest{Command: "true"})
	if err := e.M.DeleteSandbox(sandboxtest.Context(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Follow did not end with the delete")
	}
	mu.Lock()
	defer mu.Unlock()
	if d := strings.Join(describe(got), ","); d != "run.started true,run.ended ok,delete" {
		t.Fatalf("followed %s", d)
	}
}

// Egress records join the run in progress; bridge events are recorded.
func TestRecorderEgressAndBridge(t *testing.T) {
	rec, e, _ := newRecorder(t)
	sb := e.Create(api.CreateSandboxRequest{})
	s, err := e.M.Exec(sandboxtest.Context(t), sb.ID, api.ExecRequest{Command: "sleep 0.3"})
	if err != nil {
		t.Fatal(err)
	}
	var run string
	sandboxtest.WaitFor(t, "the run's process", func() bool {
		run = rec.LiveRun(sandboxtest.Context(t), sb.ID)
		return run != ""
	})
	rec.Egress(api.EgressRecord{Time: time.Now(), SandboxID: sb.ID, RunID: run, Kind: "connect", Destination: "example.com:443", Decision: api.EgressDenied})
	sandboxtest.Drain(t, s)
	if rec.LiveRun(sandboxtest.Context(t), sb.ID) != "" {
		t.Fatal("run still live after its exit")
	}
	rec.Bridge(api.SandboxEvent{Time: time.Now(), SandboxID: sb.ID, RunID: "run_x", Type: api.SandboxEventLog, Message: "hi"})
	evs := events(t, rec, sb.ID, api.EventQuery{Types: []string{api.EventNetwork, api.SandboxEventLog}})
	if len(evs) != 2 || evs[0].RunID != run || evs[0].Egress.Decision != api.EgressDenied || evs[1].Message != "hi" {
		t.Fatalf("events %+v", evs)
	}
}

// TestRecorderTracksFromSize: a layer smaller than Config.TrackFrom is
// walked run by run; once it has grown past it, its runs are followed by
// the change tracker, and stay so; both record the same changes.
func TestRecorderTracksFromSize(t *testing.T) {
	rec, e, _ := newRecorderWith(t, true, func(c *audit.Config) { c.TrackFrom = 100 })
	sb := e.Create(api.CreateSandboxRequest{})
	tracked := func() uint64 {
		_, n, _ := audit.TrackerStats(rec)
		return n
	}
	changed := func(cmd string) []string {
		t.Helper()
		start := len(events(t, rec, sb.ID, api.EventQuery{}))
		if r := e.Exec(sb.ID, api.ExecRequest{Command: cmd}); r.Code != 0 {
			t.Fatalf("exec %q: %+v", cmd, r)
		}
		var out []string
		for _, ev := range events(t, rec, sb.ID, api.EventQuery{})[start:] {
			if ev.File != nil {
				out = append(out, ev.File.Change+" "+ev.File.Path)
			}
		}
		return out
	}
	if got := changed("echo a > small.txt"); !slices.Equal(got, []string{"created /small.txt"}) {
		t.Errorf("small layer: %v", got)
	}
	if got := changed("echo b >> small.txt"); !slices.Equal(got, []string{"modified /small.txt"}) {
		t.Errorf("small layer, second run: %v", got)
	}
	if n := tracked(); n != 0 {
		t.Fatalf("%d runs of a 1-entry layer tracked; want them walked", n)
	}
	// The run that grows the layer is walked (it started small) ...
	if got := changed("mkdir many && cd many && i=0; while [ $i -lt 150 ]; do echo $i > f$i; i=$((i+1)); done"); len(got) != 151 {
		t.Errorf("growing run recorded %d changes, want 151", len(got))
	}
	// ... and the next ones are tracked, with the same records.
	for i, cmd := range []string{"echo c > many/f7", "rm many/f8; mv small.txt big.txt"} {
		want := [][]string{{"modified /many/f7"}, {"created /big.txt", "deleted /many/f8", "deleted /small.txt"}}[i]
		if got := changed(cmd); !slices.Equal(got, want) {
			t.Errorf("tracked run %d: %v, want %v", i, got, want)
		}
	}
	if n := tracked(); n != 2 {
		t.Errorf("%d runs tracked after the layer grew past 100 entries, want 2", n)
	}
}
