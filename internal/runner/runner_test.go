package runner

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The mapped root of the tests' sandboxes; the self-check runs as it.
const testUID = 100000

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// fakeGuest builds testdata/fakeguest with behaviour mode (static, like a
// real runner) and returns its path.
func fakeGuest(t *testing.T, mode string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[mode]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "runner-fake-")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "agentbox")
	cmd := exec.Command("go", "build", "-o", p, "-ldflags", "-X main.mode="+mode, "./testdata/fakeguest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if mode == "cgo" {
		// A good guest built with cgo on, yet static: net and os/user
		// in pure Go, so no C toolchain is needed to build it.
		cmd = exec.Command("go", "build", "-o", p, "-tags", "netgo,osusergo", "-ldflags", "-X main.mode=ok", "./testdata/fakeguest")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building fake guest: %v\n%s", err, out)
	}
	built[mode] = p
	return p
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range built {
		_ = os.RemoveAll(filepath.Dir(p))
	}
	os.Exit(code)
}

// newStore returns a Store in a directory the mapped uid can traverse.
func newStore(t *testing.T) *Store {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	return &Store{Root: filepath.Join(dir, "runner"), UID: testUID, GID: testUID, Timeout: 5 * time.Second}
}

func TestStageValidRunner(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newStore(t)
	bin := fakeGuest(t, "ok")
	r, err := s.StageFile(context.Background(), bin)
	if err != nil {
		t.Fatalf("StageFile: %v", err)
	}
	want, _ := Build(bin)
	if r.Version != "1.2.3" || r.Build != want || !ValidHash(r.Hash) || r.Dir != filepath.Join(s.Root, r.Hash) {
		t.Fatalf("runner = %+v (build of file %q)", r, want)
	}
	if r.GuestVersion() != "1.2.3+"+want {
		t.Errorf("GuestVersion = %q", r.GuestVersion())
	}
	fi, err := os.Stat(filepath.Join(r.Dir, BinaryName))
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("staged binary: %v %v", fi, err)
	}
	orig, _ := os.ReadFile(bin)
	staged, _ := os.ReadFile(filepath.Join(r.Dir, BinaryName))
	if !bytes.Equal(orig, staged) {
		t.Fatal("staged binary differs from the source")
	}
	// Idempotent, and Open finds it again.
	r2, err := s.StageFile(context.Background(), bin)
	if err != nil || r2 != r {
		t.Fatalf("second StageFile = %+v, %v", r2, err)
	}
	r3, err := s.Open(context.Background(), r.Hash)
	if err != nil || r3 != r {
		t.Fatalf("Open = %+v, %v", r3, err)
	}
	hashes, err := s.List()
	if err != nil || len(hashes) != 1 || hashes[0] != r.Hash {
		t.Fatalf("List = %v, %v", hashes, err)
	}
	assertNoLeftovers(t, s)
}

// The self-check runs as the unprivileged uid, with no groups, no
// environment and no network interface but loopback.
func TestSelfCheckIsLockedDown(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newStore(t)
	bin := fakeGuest(t, "whoami")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	cp := filepath.Join(dir, "agentbox")
	data, _ := os.ReadFile(bin)
	if err := os.WriteFile(cp, data, 0o555); err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		fi, _ := os.Stat(d)
		os.Chmod(d, fi.Mode().Perm()|0o711)
	}
	rep, err := s.Validate(context.Background(), cp)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if want := "uid100000-gid100000-env0-ifs1-groups0"; rep.Version != want {
		t.Fatalf("self-check ran as %q, want %q", rep.Version, want)
	}
}

func TestStageRefusesBadRunners(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newStore(t)
	script := filepath.Join(t.TempDir(), "agentbox")
	// A script that would print a perfect report.
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho '{\"version\":\"1\",\"build\":\"x\",\"protocol\":1,\"static\":true,\"seccomp_instructions\":1}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		path string
		want string
	}{
		"script":      {script, "not an ELF"},
		"dynamic":     {testutil.RequiresBinary(t, "ls"), "dynamically linked"},
		"cgo":         {fakeGuest(t, "cgo"), "built with cgo"},
		"fails":       {fakeGuest(t, "fail"), "broken on purpose"},
		"garbage":     {fakeGuest(t, "garbage"), "no report"},
		"two reports": {fakeGuest(t, "twice"), "more than one report"},
		"wrong build": {fakeGuest(t, "wrongbuild"), "reports build"},
		"protocol":    {fakeGuest(t, "protocol"), "protocol 99"},
		"hangs":       {fakeGuest(t, "hang"), "did not finish"},
		"missing":     {filepath.Join(t.TempDir(), "nope"), "does not exist"},
	}
	s.Timeout = 2 * time.Second
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := s.StageFile(context.Background(), c.path)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("StageFile = %v, want invalid argument mentioning %q", err, c.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refusing took %v", d)
			}
		})
	}
	assertNoLeftovers(t, s)
	if hashes, _ := s.List(); len(hashes) != 0 {
		t.Fatalf("refused runners were kept: %v", hashes)
	}
}

func TestStageLimits(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newStore(t)
	if _, err := s.Stage(context.Background(), strings.NewReader("")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty binary: %v", err)
	}
	if _, err := s.Open(context.Background(), "../../etc"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Open of a bad hash: %v", err)
	}
	if _, err := s.Open(context.Background(), "0123456789abcdef"); !errdefs.IsNotFound(err) {
		t.Fatalf("Open of a missing runner: %v", err)
	}
	assertNoLeftovers(t, s)
}

func TestParseReport(t *testing.T) {
	good := `{"version":"1.0","build":"abc","protocol":1,"setup":2,"static":true,"seccomp_instructions":3}`
	if _, err := parseReport([]byte(good + "\n")); err != nil {
		t.Fatalf("good report: %v", err)
	}
	for _, bad := range []string{
		"", "null", "[]", good + good,
		// A runner from before the setup protocol (it mounts host paths
		// itself): this daemon could not start it.
		`{"version":"1.0","build":"abc","protocol":1,"static":true,"seccomp_instructions":3}`,
		`{"version":"","build":"abc","protocol":1,"static":true,"seccomp_instructions":3}`,
		`{"version":"a b","build":"abc","protocol":1,"static":true,"seccomp_instructions":3}`,
		`{"version":"1\u0000","build":"abc","protocol":1,"static":true,"seccomp_instructions":3}`,
		`{"version":"1","build":"","protocol":1,"static":true,"seccomp_instructions":3}`,
		`{"version":"1","build":"abc","protocol":1,"static":false,"seccomp_instructions":3}`,
		`{"version":"1","build":"abc","protocol":1,"static":true,"seccomp_instructions":0}`,
		`{"version":"` + strings.Repeat("v", 200) + `","build":"abc","protocol":1,"static":true,"seccomp_instructions":3}`,
	} {
		if _, err := parseReport([]byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("parseReport(%.60q) = %v", bad, err)
		}
	}
}

func TestBuildDistinguishesBuilds(t *testing.T) {
	a, err := Build(fakeGuest(t, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(fakeGuest(t, "fail"))
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != buildLen {
		t.Fatalf("builds %q and %q", a, b)
	}
	// A file without a Go build id falls back to a content hash.
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("not elf"), 0o644)
	if h, err := Build(p); err != nil || len(h) != buildLen {
		t.Fatalf("Build of a plain file = %q, %v", h, err)
	}
}

func assertNoLeftovers(t *testing.T, s *Store) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(s.Root, ".stage-*"))
	if len(left) > 0 {
		t.Fatalf("staging left %v", left)
	}
}
