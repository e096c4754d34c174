package gvisor

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testutil"
)

// counterCmd starts a shell loop counting in memory, writing each value
// to /tmp/c; it keeps running after the exec returns.
const counterCmd = `(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done) >/dev/null 2>&1 </dev/null &`

func readCounter(t *testing.T, sock string) int {
	t.Helper()
	out, code := runtimetest.MustExec(t, sock, "cat /tmp/c")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("cat /tmp/c: %q, %d", out, code)
	}
	return n
}

// TestMemoryCheckpointRestore: a process counting in memory survives
// CheckpointMemory (the source keeps counting, its guest answers again)
// and RestoreMemory into two new sandboxes, each counting on from the
// checkpointed value independently.
func TestMemoryCheckpointRestore(t *testing.T) {
	testutil.Short(t)
	f := fixture(t)
	b := newBackendTB(t)
	src := runtimetest.NewSpec(t, runtimetest.NewID("msrc"), f.Layer, f.RunnerDir)
	sb := runtimetest.Create(t, b, src)
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(src.StateDir + "/guest.log")
			t.Logf("source guest log: %s", log)
		}
	})
	if out, code := runtimetest.MustExec(t, src.SocketPath, "echo hi"); code != 0 || out != "hi\n" {
		t.Fatalf("echo: %q %d", out, code)
	}
	if _, code := runtimetest.MustExec(t, src.SocketPath, counterCmd); code != 0 {
		t.Fatal("starting the counter")
	}
	time.Sleep(300 * time.Millisecond)
	image := runtimetest.TempDir(t)
	a := runtimetest.NewSpec(t, runtimetest.NewID("mfa"), f.Layer, f.RunnerDir)
	c := runtimetest.NewSpec(t, runtimetest.NewID("mfb"), f.Layer, f.RunnerDir)
	var frozenAt int
	err := sb.(*sandbox).CheckpointMemory(t.Context(), image, func() error {
		raw, err := os.ReadFile(src.UpperDir + "/tmp/c")
		if err != nil {
			return err
		}
		frozenAt, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
		for _, up := range []string{a.UpperDir, c.UpperDir} {
			if out, err := exec.Command("cp", "-a", src.UpperDir+"/.", up).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if frozenAt == 0 {
		t.Fatal("the counter had not counted before the checkpoint")
	}
	// The source answers at once and counts on.
	if n := readCounter(t, src.SocketPath); n < frozenAt {
		t.Errorf("source after checkpoint: %d < %d", n, frozenAt)
	}
	restored := map[string]string{}
	for _, s := range []runtime.Spec{a, c} {
		start := time.Now()
		rsb, err := b.RestoreMemory(t.Context(), s, image)
		if err != nil {
			t.Fatalf("RestoreMemory(%s): %v", s.ID, err)
		}
		t.Logf("restore took %v", time.Since(start))
		// t.Context is cancelled before cleanups run: a destroy on it
		// would leave the restored sandbox running.
		t.Cleanup(func() { _ = rsb.Destroy(context.WithoutCancel(t.Context())) })
		// The restored counter runs on from the checkpointed value as
		// soon as the restore resumes it: at most one count per 50 ms
		// since the restore began (plus slack) past it, never below.
		n := readCounter(t, s.SocketPath)
		if most := frozenAt + int(time.Since(start)/(50*time.Millisecond)) + 10; n < frozenAt || n > most {
			t.Errorf("fork %s is at %d: checkpointed at %d, so between %d and %d", s.ID, n, frozenAt, frozenAt, most)
		}
		restored[s.ID] = s.SocketPath
		checkHostname(t, s.SocketPath, s.ID)
	}
	checkHostname(t, src.SocketPath, src.ID)
	time.Sleep(500 * time.Millisecond)
	for id, sock := range restored {
		if n := readCounter(t, sock); n <= frozenAt {
			t.Errorf("fork %s did not count on: %d", id, n)
		}
	}
}

// checkHostname checks that the sandbox on sock calls itself want by
// every name: hostname(1), the kernel's, uname -n.
func checkHostname(t *testing.T, sock, want string) {
	t.Helper()
	out, code := runtimetest.MustExec(t, sock, "hostname; cat /proc/sys/kernel/hostname; uname -n")
	if code != 0 || out != strings.Repeat(want+"\n", 3) {
		t.Errorf("hostname of %s: %q (exit %d), want %s three times", want, out, code, want)
	}
}
