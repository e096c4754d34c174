// Package runtimetest is the conformance suite every runtime.Backend must
// pass, plus helpers to build a test guest and a busybox layer.
//
// The suite drives sandboxes whose runner directory holds the test guest
// (package testguest, see RunnerDir): a guest speaking a one-line command
// protocol (Exec); a backend that serves its guest in-process serves
// ServeLines instead. It needs root.
//
// What a backend enforces is checked against what it declares
// (runtime.Capabilities): a backend that declares CapIsolation must give
// each sandbox its own root filesystem and hostname, one that declares
// CapCgroups must apply Resources (Fixture.Limits), one that declares
// CapPause must implement Pauser, and CapStats StatsReader. A test of
// something the backend does not declare is skipped, saying so.
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

// Fixture supplies a backend and its test inputs.
type Fixture struct {
	// NewBackend returns a backend instance. Called more than once per
	// test to simulate a daemon restart: instances must interoperate.
	NewBackend func(t *testing.T) runtime.Backend
	// Layer is a read-only root filesystem (see BusyboxLayer) owned by
	// TestIDMap.
	Layer string
	// RunnerDir holds the test guest as "agentbox" (see RunnerDir).
	RunnerDir string
	// Limits reads back from the host the limits applied to sb. Optional.
	Limits func(t *testing.T, sb runtime.Sandbox) runtime.Resources
	// Leftovers lists host resources (cgroup dirs, ...) of sandbox id that
	// still exist. Optional.
	Leftovers func(t *testing.T, id string) []string
}

var idSeq struct {
	sync.Mutex
	n int
}

// NewID returns a sandbox id unique within this test process.
func NewID(prefix string) string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), idSeq.n)
}

// Create creates a sandbox and registers its Destroy with t.Cleanup.
func Create(t *testing.T, b runtime.Backend, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.ID, err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("cleanup Destroy(%s): %v", spec.ID, err)
		}
	})
	return sb
}

// Run runs the conformance suite.
func Run(t *testing.T, f Fixture) {
	testutil.RequiresRoot(t)
	t.Run("CreateExecDestroy", func(t *testing.T) { testCreateExecDestroy(t, f) })
	t.Run("Recover", func(t *testing.T) { testRecover(t, f) })
	t.Run("Cleanup", func(t *testing.T) { testCleanup(t, f) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, f) })
	t.Run("CreateFailureLeavesNothing", func(t *testing.T) { testCreateFailure(t, f) })
	t.Run("TwoSandboxes", func(t *testing.T) { testTwoSandboxes(t, f) })
	t.Run("PauseResume", func(t *testing.T) { testPauseResume(t, f) })
	t.Run("CreateExistingID", func(t *testing.T) { testCreateExistingID(t, f) })
	t.Run("CreateCancelled", func(t *testing.T) { testCreateCancelled(t, f) })
}

// AssertGone checks that nothing of spec's sandbox remains on the host.
func AssertGone(t *testing.T, f Fixture, sb runtime.Sandbox, spec runtime.Spec) {
	t.Helper()
	if sb != nil {
		select {
		case <-sb.Wait():
		case <-time.After(10 * time.Second):
			t.Errorf("Wait() not closed after destroy")
		}
		if st, err := sb.Status(context.Background()); err != nil || st != runtime.StatusStopped {
			t.Errorf("Status = %q, %v; want stopped", st, err)
		}
	}
	if _, err := os.Lstat(spec.SocketPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s still exists (%v)", spec.SocketPath, err)
	}
	if _, err := os.Lstat(spec.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir %s still exists (%v)", spec.StateDir, err)
	}
	if f.Leftovers != nil {
		if l := f.Leftovers(t, spec.ID); len(l) > 0 {
			t.Errorf("left behind: %v", l)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), spec.StateDir) {
		t.Errorf("host mountinfo mentions %s", spec.StateDir)
	}
}

func testCreateExecDestroy(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	spec := NewSpec(t, NewID("ced"), f.Layer, f.RunnerDir)
	sb := Create(t, b, spec)
	if sb.ID() != spec.ID || sb.SocketPath() != spec.SocketPath {
		t.Errorf("ID/SocketPath = %s, %s", sb.ID(), sb.SocketPath())
	}
	if len(sb.State()) == 0 {
		t.Error("empty State()")
	}
	if b.Capabilities().Has(runtime.CapIsolation) {
		out, code := MustExec(t, spec.SocketPath, "echo hello; hostname")
		if code != 0 || out != "hello\n"+spec.ID+"\n" {
			t.Errorf("exec = %q, %d", out, code)
		}
	} else {
		out, code := MustExec(t, spec.SocketPath, "echo hello")
		if code != 0 || out != "hello\n" {
			t.Errorf("exec = %q, %d", out, code)
		}
	}
	if _, code := MustExec(t, spec.SocketPath, "exit 3"); code != 3 {
		t.Errorf("exit code = %d, want 3", code)
	}
	if st, err := sb.Status(context.Background()); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status = %q, %v", st, err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	AssertGone(t, f, sb, spec)
	if err := sb.Destroy(context.Background()); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}

func testRecover(t *testing.T, f Fixture) {
	ctx := context.Background()
	spec := NewSpec(t, NewID("rec"), f.Layer, f.RunnerDir)
	sb := Create(t, f.NewBackend(t), spec)
	state := sb.State()

	b2 := f.NewBackend(t) // the "restarted daemon"
	sb2, err := b2.Recover(ctx, spec, state)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if out, _ := MustExec(t, sb2.SocketPath(), "echo again"); out != "again\n" {
		t.Errorf("exec after recover = %q", out)
	}
	if st, _ := sb2.Status(ctx); st != runtime.StatusRunning {
		t.Errorf("recovered Status = %q", st)
	}
	for name, bogus := range map[string][]byte{
		"garbage":   []byte("not json"),
		"empty":     []byte("{}"),
		"init":      []byte(`{"pid":1}`),
		"otherpid":  []byte(fmt.Sprintf(`{"pid":%d,"start_time":1}`, os.Getpid())),
		"startTime": []byte(strings.Replace(string(state), `"start_time":`, `"start_time":9`, 1)),
	} {
		if _, err := b2.Recover(ctx, spec, bogus); !errdefs.IsNotFound(err) {
			t.Errorf("Recover(%s) = %v, want ErrNotFound", name, err)
		}
	}
	if err := sb2.Destroy(ctx); err != nil {
		t.Fatalf("Destroy recovered: %v", err)
	}
	AssertGone(t, f, sb2, spec)
	select {
	case <-sb.Wait():
	case <-time.After(10 * time.Second):
		t.Error("original handle's Wait() not closed")
	}
	if _, err := b2.Recover(ctx, spec, state); !errdefs.IsNotFound(err) {
		t.Errorf("Recover(dead) = %v, want ErrNotFound", err)
	}
}

func testCleanup(t *testing.T, f Fixture) {
	spec := NewSpec(t, NewID("cln"), f.Layer, f.RunnerDir)
	sb := Create(t, f.NewBackend(t), spec)
	MustExec(t, spec.SocketPath, "setsid sh -c 'sleep 1000 &' >/dev/null 2>&1")
	b2 := f.NewBackend(t)
	if err := b2.Cleanup(context.Background(), spec); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	AssertGone(t, f, sb, spec)
	if err := b2.Cleanup(context.Background(), spec); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

func testLimits(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	if !b.Capabilities().Has(runtime.CapCgroups) {
		t.Skip("the backend does not declare " + runtime.CapCgroups + ": it enforces no limits")
	}
	if f.Limits == nil {
		t.Fatal("the backend declares " + runtime.CapCgroups + " but the fixture has no Limits reader")
	}
	spec := NewSpec(t, NewID("lim"), f.Layer, f.RunnerDir)
	spec.Resources = runtime.Resources{CPUs: 0.5, MemoryBytes: 64 << 20, PidsMax: 64}
	sb := Create(t, b, spec)
	if got := f.Limits(t, sb); got != spec.Resources {
		t.Errorf("applied limits = %+v, want %+v", got, spec.Resources)
	}
}

func testCreateFailure(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	spec := NewSpec(t, NewID("fail"), f.Layer, f.RunnerDir)
	spec.Layers = []string{spec.StateDir + "-does-not-exist"}
	sb, err := b.Create(context.Background(), spec)
	if err == nil {
		sb.Destroy(context.Background())
		t.Fatal("Create with a missing layer succeeded")
	}
	t.Logf("expected error: %v", err)
	AssertGone(t, f, nil, spec)

	spec = NewSpec(t, NewID("fail"), f.Layer, t.TempDir()) // no guest binary
	if _, err := b.Create(context.Background(), spec); err == nil {
		t.Fatal("Create without a guest binary succeeded")
	}
	AssertGone(t, f, nil, spec)

	spec = NewSpec(t, "Bad_ID", f.Layer, f.RunnerDir)
	if _, err := b.Create(context.Background(), spec); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Create(bad id) = %v, want ErrInvalidArgument", err)
	}
}

func testTwoSandboxes(t *testing.T, f Fixture) {
	b := f.NewBackend(t)
	specs := []runtime.Spec{
		NewSpec(t, NewID("two"), f.Layer, f.RunnerDir),
		NewSpec(t, NewID("two"), f.Layer, f.RunnerDir),
	}
	sbs := make([]runtime.Sandbox, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := b.Create(context.Background(), specs[i])
			if err != nil {
				t.Errorf("Create %d: %v", i, err)
				return
			}
			sbs[i] = sb
		}()
	}
	wg.Wait()
	// Each sandbox writes its id to a file of the same name and reads it
	// back. With CapIsolation the file is /tmp/mine of its own root
	// filesystem and its hostname is its id; without, the file is
	// relative to the guest's working directory, which must be the
	// sandbox's own.
	file, check := "mine", "cat mine"
	if b.Capabilities().Has(runtime.CapIsolation) {
		file, check = "/tmp/mine", "cat /tmp/mine; hostname"
	}
	for i, sb := range sbs {
		if sb == nil {
			t.FailNow()
		}
		t.Cleanup(func() { sb.Destroy(context.Background()) })
		MustExec(t, specs[i].SocketPath, "echo "+specs[i].ID+" > "+file)
	}
	for i := range sbs {
		want := specs[i].ID + "\n"
		if b.Capabilities().Has(runtime.CapIsolation) {
			want += specs[i].ID + "\n"
		}
		if out, _ := MustExec(t, specs[i].SocketPath, check); out != want {
			t.Errorf("sandbox %d sees %q", i, out)
		}
	}
	if err := sbs[0].Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out, _ := MustExec(t, specs[1].SocketPath, "echo alive"); out != "alive\n" {
		t.Errorf("second sandbox after first destroyed: %q", out)
	}
}

func testPauseResume(t *testing.T, f Fixture) {
	ctx := context.Background()
	spec := NewSpec(t, NewID("pause"), f.Layer, f.RunnerDir)
	b := f.NewBackend(t)
	caps := b.Capabilities()
	sb := Create(t, b, spec)
	p, ok := sb.(runtime.Pauser)
	if ok != caps.Has(runtime.CapPause) {
		t.Fatalf("sandbox implements Pauser: %v; backend declares %s: %v", ok, runtime.CapPause, caps.Has(runtime.CapPause))
	}
	sr, sok := sb.(runtime.StatsReader)
	if sok != caps.Has(runtime.CapStats) {
		t.Fatalf("sandbox implements StatsReader: %v; backend declares %s: %v", sok, runtime.CapStats, caps.Has(runtime.CapStats))
	}
	if !ok {
		t.Skip("the backend does not declare " + runtime.CapPause)
	}
	if !sok {
		t.Skip("the backend does not declare " + runtime.CapStats + " (needed to observe CPU time)")
	}
	MustExec(t, spec.SocketPath, "(while :; do :; done) >/dev/null 2>&1 &")
	time.Sleep(200 * time.Millisecond)
	if err := p.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	s1, err := sr.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	s2, _ := sr.Stats(ctx)
	if d := s2.CPUTime - s1.CPUTime; d > 20*time.Millisecond {
		t.Errorf("CPU time advanced %v while paused", d)
	}
	if _, _, err := Exec(spec.SocketPath, "echo hi", 300*time.Millisecond); err == nil {
		t.Error("paused guest answered")
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	s3, _ := sr.Stats(ctx)
	if d := s3.CPUTime - s2.CPUTime; d < 50*time.Millisecond {
		t.Errorf("CPU time advanced only %v after resume", d)
	}
	if s3.Pids < 2 || s3.MemoryBytes <= 0 {
		t.Errorf("stats = %+v", s3)
	}
	// Destroy must work on a paused sandbox too.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy paused: %v", err)
	}
	AssertGone(t, f, sb, spec)
}
