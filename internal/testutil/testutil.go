// Package testutil holds the privilege and feature gates shared by every
// test in the repository. A test that needs root or a kernel feature calls
// one of these first; it skips with a clear message where the feature is
// missing. CI runs as root on a machine that has them all, so a skip in CI is
// a failure of the environment, not a pass: set AGENTBOX_TEST_STRICT=1 to
// turn every skip from these gates into a failure.
package testutil

import (
	"os"
	"os/exec"
	"testing"
)

func skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("AGENTBOX_TEST_STRICT") == "1" {
		t.Fatalf("AGENTBOX_TEST_STRICT=1 but: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequiresRoot skips t unless it runs as host root.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipf(t, "requires root (run the suite as root, as CI does)")
	}
}

// RequiresBinary skips t unless name is on PATH.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		skipf(t, "requires %s on PATH (installed by .ci/run)", name)
	}
	return p
}

// RequiresFile skips t unless path exists.
func RequiresFile(t testing.TB, path, why string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		skipf(t, "requires %s (%s)", path, why)
	}
}

// Requires skips t unless ok, naming the missing capability (a kernel
// feature, a cgroup layout) in why.
func Requires(t testing.TB, ok bool, why string) {
	t.Helper()
	if !ok {
		skipf(t, "requires %s", why)
	}
}

// Short skips t in -short mode (slow integration tests).
func Short(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow test skipped in -short mode")
	}
}

// NotApplicable skips t, also under AGENTBOX_TEST_STRICT, when what it
// checks does not exist on this host (not a missing feature: e.g. a case
// of cgroup v1 on a v2 host, which another test covers), saying why.
func NotApplicable(t testing.TB, why string) {
	t.Helper()
	t.Skipf("not applicable here: %s", why)
}
