package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Runner hot-swap: a sandbox's guest is upgraded to another agentbox build
// while its files and installed packages stay byte-identical; broken
// builds never leave a sandbox on a half-upgraded or dead guest.

// installPackage puts an "installed package" into the sandbox: a program
// on the PATH and its config file, next to user files.
const installPackage = `set -e
mkdir -p /usr/local/bin /root/work
printf '#!/bin/sh\necho "tool $(cat /etc/tool.conf)"\n' > /usr/local/bin/tool
chmod 0755 /usr/local/bin/tool
echo 'mode=fast' > /etc/tool.conf
dd if=/dev/urandom of=/root/work/data.bin bs=1k count=200 2>/dev/null
echo 'notes' > /root/work/notes.txt`

var (
	variantMu sync.Mutex
	variants  = map[string]string{}
)

// agentboxVariant builds agentbox with extra -X link flags (memoised per
// flag set) into a temporary directory and returns the binary's path.
func agentboxVariant(t *testing.T, xflags ...string) string {
	t.Helper()
	key := strings.Join(xflags, " ")
	variantMu.Lock()
	defer variantMu.Unlock()
	if p, ok := variants[key]; ok {
		return p
	}
	// One directory per flag set, rebuilt by every test run (go build is
	// incremental) and replaced atomically: runs do not pile up binaries.
	sum := sha256.Sum256([]byte(key))
	dir := filepath.Join(os.TempDir(), "agentbox-variant-"+hex.EncodeToString(sum[:4]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "agentbox")
	tmp := p + ".tmp-" + randHex(4)
	var ld []string
	for _, x := range xflags {
		ld = append(ld, "-X", x)
	}
	cmd := exec.Command("go", "build", "-o", tmp, "-ldflags", strings.Join(ld, " "), "github.com/agentbox/agentbox/cmd/agentbox")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("building agentbox %v: %v\n%s", xflags, err, out)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	variants[key] = p
	return p
}

const versionVar = "github.com/agentbox/agentbox/internal/version.Version"

func goodBuild(t *testing.T) string { return agentboxVariant(t, versionVar+"=9.9.9-test") }
func badSelfcheckBuild(t *testing.T) string {
	return agentboxVariant(t, versionVar+"=9.9.9-badcheck", "main.faultInject=selfcheck")
}
func badInitBuild(t *testing.T) string {
	return agentboxVariant(t, versionVar+"=9.9.9-badinit", "main.faultInject=guest-init")
}

// buildVariants builds the test variants in parallel (each link takes a
// while).
func buildVariants(t *testing.T, builds ...func(*testing.T) string) {
	var wg sync.WaitGroup
	for _, b := range builds {
		wg.Add(1)
		go func() { defer wg.Done(); b(t) }()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// guestSHA is the sha256 of the guest binary mounted in the sandbox.
func guestSHA(t *testing.T, sb *agentbox.Sandbox) string {
	t.Helper()
	out := mustRun(t, sb, "sha256sum /.agentbox/agentbox")
	return strings.Fields(out)[0]
}

func TestUpgradeGuestKeepsFilesAndPackages(t *testing.T) {
	d := newDaemon(t)
	buildVariants(t, goodBuild)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, installPackage)
	want := mustRun(t, sb, manifestCmd)
	if !strings.Contains(want, "./usr/local/bin/tool") || !strings.Contains(want, "./root/work/data.bin") {
		t.Fatalf("manifest misses the package:\n%s", want)
	}
	info, err := d.client.Get(ctx, sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	v0, r0 := info.Info().GuestVersion, info.Info().Runner
	if !strings.Contains(v0, "+") || len(r0) != 16 {
		t.Fatalf("a new sandbox reports guest %q on runner %q", v0, r0)
	}
	oldSHA := guestSHA(t, sb)

	good := goodBuild(t)
	res, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: good})
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	t.Logf("upgraded %s -> %s in %d ms", res.FromVersion, res.ToVersion, res.DurationMS)
	if !res.Changed || res.FromVersion != v0 || res.FromRunner != r0 || res.ToRunner == r0 ||
		!strings.HasPrefix(res.ToVersion, "9.9.9-test+") || res.Sandbox.GuestVersion != res.ToVersion || res.Sandbox.Runner != res.ToRunner {
		t.Fatalf("upgrade result %+v", res)
	}
	// The guest itself answers with the new build, to a fresh client too.
	got, err := d.client.Get(ctx, sb.ID())
	if err != nil || got.Info().GuestVersion != res.ToVersion || got.Info().State != "running" {
		t.Fatalf("after upgrade: %+v, %v", got.Info(), err)
	}
	// The mounted runner is the new binary; files and package untouched.
	if s := guestSHA(t, sb); s != fileSHA(t, good) || s == oldSHA {
		t.Fatalf("guest binary in the sandbox is %s, want %s", s, fileSHA(t, good))
	}
	if after := mustRun(t, sb, manifestCmd); after != want {
		t.Fatalf("files changed by the upgrade:\nbefore:\n%s\nafter:\n%s", want, after)
	}
	if out := mustRun(t, sb, "tool"); out != "tool mode=fast\n" {
		t.Fatalf("installed tool says %q", out)
	}
	// Upgrading to the same runner changes nothing.
	again, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{RunnerHash: res.ToRunner})
	if err != nil || again.Changed || again.ToVersion != res.ToVersion {
		t.Fatalf("second upgrade: %+v, %v", again, err)
	}
	// The runner list knows who runs what.
	rs, err := d.client.Runners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, r := range rs {
		switch r.Hash {
		case r0:
			seen++
			if !r.Default || len(r.Sandboxes) != 0 {
				t.Errorf("daemon runner %+v", r)
			}
		case res.ToRunner:
			seen++
			if r.Default || len(r.Sandboxes) != 1 || r.Sandboxes[0] != sb.ID() {
				t.Errorf("new runner %+v", r)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("runners %+v", rs)
	}

	// A restarted daemon re-adopts the sandbox on its recorded runner, and
	// a later restart of its guest (restore) keeps that runner.
	d.restart(syscall.SIGTERM)
	sb2, err := d.client.Get(ctx, sb.ID())
	if err != nil || sb2.Info().Runner != res.ToRunner || sb2.Info().GuestVersion != res.ToVersion {
		t.Fatalf("after daemon restart: %+v, %v", sb2.Info(), err)
	}
	ck, err := sb2.Checkpoint(ctx, "upgraded")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb2.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	if s := guestSHA(t, sb2); s != fileSHA(t, good) {
		t.Fatalf("restore went back to another runner: %s", s)
	}

	// Back to the daemon's own runner (no runner named).
	back, err := sb2.Upgrade(ctx, agentbox.UpgradeOptions{})
	if err != nil || back.ToVersion != v0 || back.ToRunner != r0 {
		t.Fatalf("downgrade: %+v, %v", back, err)
	}
	if s := guestSHA(t, sb2); s != oldSHA {
		t.Fatal("guest binary is not the daemon's again")
	}
	if after := mustRun(t, sb2, manifestCmd); after != want {
		t.Fatalf("files changed by the downgrade:\n%s", after)
	}
}

// upgradeStatus returns the HTTP status of an SDK error.
func upgradeStatus(err error) int {
	var ae *agentbox.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func TestUpgradeFailuresLeaveSandboxWorking(t *testing.T) {
	d := newDaemon(t)
	buildVariants(t, goodBuild, badSelfcheckBuild, badInitBuild)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, installPackage)
	want := mustRun(t, sb, manifestCmd)
	v0 := sb.Info().GuestVersion
	// A background process shows whether the guest was restarted.
	if _, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 1000"}); err != nil {
		t.Fatal(err)
	}
	sleeping := func() bool {
		return strings.Contains(string(run(t, sb, "ps -o args | grep -v grep | grep 'sleep 1000' || true").Stdout), "sleep 1000")
	}
	if !sleeping() {
		t.Fatal("background process not running")
	}

	// Binaries that fail validation are refused before anything is
	// touched: the guest is not even restarted.
	script := filepath.Join(t.TempDir(), "agentbox")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho '{\"version\":\"1\",\"build\":\"x\",\"protocol\":1,\"static\":true,\"seccomp_instructions\":1}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, bin := range map[string]string{"failing self-check": badSelfcheckBuild(t), "shell script": script, "dynamic binary": "/bin/ls"} {
		_, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: bin})
		if upgradeStatus(err) != 400 {
			t.Fatalf("%s: upgrade = %v, want 400", name, err)
		}
		t.Logf("%s refused: %v", name, err)
	}
	f, err := os.Open(badSelfcheckBuild(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.client.StageRunner(ctx, f, -1)
	f.Close()
	if upgradeStatus(err) != 400 || !strings.Contains(err.Error(), "fault injected") {
		t.Fatalf("staging a failing runner: %v", err)
	}
	if !sleeping() {
		t.Fatal("a refused upgrade restarted the sandbox's processes")
	}
	if got, _ := d.client.Get(ctx, sb.ID()); got.Info().GuestVersion != v0 {
		t.Fatalf("guest version %q after refused upgrades", got.Info().GuestVersion)
	}
	if rs, _ := d.client.Runners(ctx); len(rs) != 1 {
		t.Fatalf("refused runners were kept: %+v", rs)
	}
	left, _ := filepath.Glob(filepath.Join(d.dataDir, "runner", ".stage-*"))
	if len(left) > 0 {
		t.Fatalf("staging left %v", left)
	}

	// A build that passes its self-check but whose guest does not start:
	// rolled back to the previous guest, files intact.
	_, err = sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: badInitBuild(t)})
	if upgradeStatus(err) != 412 || !strings.Contains(err.Error(), "previous guest") {
		t.Fatalf("upgrade to a guest that dies = %v, want 412 rolled back", err)
	}
	t.Logf("rolled back: %v", err)
	checkOn := func(version string) {
		t.Helper()
		got, err := d.client.Get(ctx, sb.ID())
		if err != nil || got.Info().GuestVersion != version || got.Info().State != "running" {
			t.Fatalf("sandbox %+v, %v; want running guest %s", got.Info(), err, version)
		}
		if after := mustRun(t, sb, manifestCmd); after != want {
			t.Fatalf("files changed:\nbefore:\n%s\nafter:\n%s", want, after)
		}
		if out := mustRun(t, sb, "tool"); out != "tool mode=fast\n" {
			t.Fatalf("tool says %q", out)
		}
	}
	checkOn(v0)

	// The previous runner cannot start either (its directory is gone): the
	// sandbox falls back to the daemon's own guest.
	res, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: goodBuild(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(d.dataDir, "runner", res.ToRunner)); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: badInitBuild(t)})
	if upgradeStatus(err) != 412 || !strings.Contains(err.Error(), "daemon's guest") {
		t.Fatalf("upgrade with a broken previous runner = %v, want 412 on the daemon's guest", err)
	}
	t.Logf("fell back: %v", err)
	checkOn(v0)
	if sleeping() {
		t.Fatal("processes survived a guest restart")
	}
}

// Paused and hibernated sandboxes are upgraded and put back to sleep.
func TestUpgradeSleepingSandboxes(t *testing.T) {
	d := newDaemon(t)
	buildVariants(t, goodBuild)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, sleep := range []string{"paused", "hibernated"} {
		t.Run(sleep, func(t *testing.T) {
			sb := d.create(t, agentbox.SandboxSpec{})
			mustRun(t, sb, installPackage)
			want := mustRun(t, sb, manifestCmd)
			var err error
			if sleep == "paused" {
				err = sb.Pause(ctx)
			} else {
				err = sb.Hibernate(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			res, err := sb.Upgrade(ctx, agentbox.UpgradeOptions{Runner: goodBuild(t)})
			if err != nil {
				t.Fatalf("upgrade: %v", err)
			}
			if res.Sandbox.State != sleep || !strings.HasPrefix(res.Sandbox.GuestVersion, "9.9.9-test+") {
				t.Fatalf("after upgrade: state %s, guest %s", res.Sandbox.State, res.Sandbox.GuestVersion)
			}
			// The next call wakes it, on the new guest, files intact.
			if after := mustRun(t, sb, manifestCmd); after != want {
				t.Fatalf("files changed:\n%s", after)
			}
			if s := guestSHA(t, sb); s != fileSHA(t, goodBuild(t)) {
				t.Fatal("woke on another runner")
			}
			got, err := d.client.Get(ctx, sb.ID())
			if err != nil || got.Info().State != "running" || got.Info().GuestVersion != res.ToVersion {
				t.Fatalf("woken: %+v, %v", got.Info(), err)
			}
		})
	}
}

func TestUpgradeCLI(t *testing.T) {
	d := newDaemon(t)
	buildVariants(t, goodBuild)
	a := d.create(t, agentbox.SandboxSpec{})
	b := d.create(t, agentbox.SandboxSpec{})
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(agentboxBin(t), args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_HOST=unix://"+d.socket)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := cli("upgrade", "--all", "--runner", goodBuild(t))
	if err != nil {
		t.Fatalf("upgrade --all: %v\n%s", err, out)
	}
	for _, sb := range []*agentbox.Sandbox{a, b} {
		if !strings.Contains(out, sb.ID()) || !strings.Contains(out, "9.9.9-test+") {
			t.Fatalf("output misses %s:\n%s", sb.ID(), out)
		}
		if s := guestSHA(t, sb); s != fileSHA(t, goodBuild(t)) {
			t.Fatalf("%s not upgraded", sb.ID())
		}
	}
	out, err = cli("runners")
	if err != nil || strings.Count(out, "\n") != 3 {
		t.Fatalf("runners: %v\n%s", err, out)
	}
	if out, err = cli("upgrade", a.ID()); err != nil || !strings.Contains(out, fmt.Sprintf("%s\t9.9.9-test+", a.ID())) {
		t.Fatalf("upgrade back: %v\n%s", err, out)
	}
	if out, err := cli("upgrade", "--runner", "/bin/ls", b.ID()); err == nil || !strings.Contains(out, "dynamically linked") {
		t.Fatalf("upgrade to /bin/ls: %v\n%s", err, out)
	}
}
