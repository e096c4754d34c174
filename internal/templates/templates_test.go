package templates

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/layers"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

var testIDs = runtime.IDMap{HostID: 100000, Size: 65536}

// fakeRunner stands in for the sandbox manager. A command is
// "write PATH CONTENT", "noop", "fail" or "block" (waits for ctx).
type fakeRunner struct {
	calls atomic.Int32
	delay time.Duration

	mu   sync.Mutex
	last fakeCall
}

type fakeCall struct {
	layers []string
	env    map[string]string
}

func (f *fakeRunner) RunStep(ctx context.Context, layers []string, upperDir string, env map[string]string, command string, output io.Writer) error {
	f.calls.Add(1)
	f.mu.Lock()
	f.last = fakeCall{layers: layers, env: env}
	f.mu.Unlock()
	for _, d := range []string{upperDir, filepath.Join(filepath.Dir(upperDir), "work")} {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil || st.Uid != testIDs.HostID || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("fake: %s not a dir owned by mapped root: %v", d, err)
		}
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Fprintf(output, "running %s\nsecond line", command)
	f2 := strings.SplitN(command, " ", 3)
	switch f2[0] {
	case "write":
		p := filepath.Join(upperDir, f2[1])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(f2[2]), 0o644); err != nil {
			return err
		}
		for d := p; d != upperDir; d = filepath.Dir(d) {
			if err := os.Lchown(d, int(testIDs.HostID), int(testIDs.HostID)); err != nil {
				return err
			}
		}
		return nil
	case "noop":
		return nil
	case "block":
		<-ctx.Done()
		return ctx.Err()
	default:
		return errors.New("exit status 1")
	}
}

func newManager(t *testing.T, runner StepRunner) (*Manager, Config) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresFile(t, "/bin/busybox", "package busybox-static")
	dir := t.TempDir()
	store, err := layers.New(filepath.Join(dir, "layers"), testIDs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DataDir: filepath.Join(dir, "templates"), Layers: store, IDs: testIDs, Runner: runner}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, cfg
}

type events struct {
	mu  sync.Mutex
	evs []api.BuildEvent
}

func (e *events) add(ev api.BuildEvent) { e.mu.Lock(); e.evs = append(e.evs, ev); e.mu.Unlock() }

func (e *events) steps() []api.BuildEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []api.BuildEvent
	for _, ev := range e.evs {
		if ev.Type == api.BuildEventStep {
			out = append(out, ev)
		}
	}
	return out
}

func (e *events) logs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.evs {
		if ev.Type == api.BuildEventLog {
			out = append(out, ev.Message)
		}
	}
	return out
}

func build(t *testing.T, m *Manager, req api.BuildTemplateRequest) (Template, *events) {
	t.Helper()
	var ev events
	tmpl, err := m.Build(context.Background(), req, ev.add)
	if err != nil {
		t.Fatal(err)
	}
	last := ev.evs[len(ev.evs)-1]
	if last.Type != api.BuildEventDone || last.Template == nil || last.Template.ID != tmpl.ID || !last.Template.Built {
		t.Fatalf("last event %+v", last)
	}
	return tmpl, &ev
}

func TestBusybox(t *testing.T) {
	m, cfg := newManager(t, nil)
	tmpl, ev := build(t, m, api.BuildTemplateRequest{Name: "busybox"})
	if st := ev.steps(); len(st) != 1 || st[0].Cached || st[0].Message != "FROM busybox" {
		t.Errorf("steps %+v", st)
	}
	if len(tmpl.Layers) != 1 || !tmpl.Builtin || tmpl.ID == "" || tmpl.SizeBytes <= 0 {
		t.Fatalf("template %+v", tmpl)
	}
	root := tmpl.Layers[0]
	if target, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/sh -> %q %v", target, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "usr/bin/env")); err != nil {
		t.Errorf("usr/bin/env: %v", err)
	}
	want := map[string]uint32{"bin/busybox": 0o755, "etc/passwd": 0o644, "root": 0o700, "tmp": 0o1777, "var/tmp": 0o1777, ".": 0o755, "proc": 0o555}
	for rel, mode := range want {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 100000 || st.Gid != 100000 || st.Mode&0o7777 != mode {
			t.Errorf("%s: %d:%d %o, want 100000 %o", rel, st.Uid, st.Gid, st.Mode&0o7777, mode)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); !strings.HasPrefix(string(b), "root:x:0:0:") || !strings.Contains(string(b), "nobody:x:65534") {
		t.Errorf("passwd %q", b)
	}
	// The rootfs works: its shell runs in a chroot.
	out, err := exec.Command("chroot", root, "/bin/sh", "-c", "echo hi from $(basename /bin/*sh | head -1)").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "hi from") {
		t.Errorf("chroot sh: %q %v", out, err)
	}

	// Rebuild: instant, cached, same template.
	start := time.Now()
	again, ev := build(t, m, api.BuildTemplateRequest{Name: "busybox"})
	if st := ev.steps(); len(st) != 1 || !st[0].Cached {
		t.Errorf("rebuild steps %+v", st)
	}
	if again.ID != tmpl.ID || !again.CreatedAt.Equal(tmpl.CreatedAt) || time.Since(start) > time.Second {
		t.Errorf("rebuild %+v (took %v), want %+v", again, time.Since(start), tmpl)
	}

	list, err := m.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.Template{}
	for _, l := range list {
		got[l.Name] = l
	}
	if b := got["busybox"]; !b.Built || !b.Builtin || b.ID != tmpl.ID {
		t.Errorf("list busybox %+v", b)
	}
	if d := got["debian"]; d.Built || !d.Builtin || d.Env["LANG"] != "C.UTF-8" {
		t.Errorf("list debian %+v", d)
	}
	if _, err := m.Get(context.Background(), "debian"); !errdefs.IsNotFound(err) {
		t.Errorf("Get unbuilt: %v", err)
	}
	// The template's layer is referenced: it cannot be removed.
	if err := cfg.Layers.Remove(context.Background(), tmpl.ID); !errdefs.IsConflict(err) {
		t.Errorf("removing a template's layer: %v", err)
	}
	// A restarted daemon sees the same template.
	m2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if t2, err := m2.Get(context.Background(), "busybox"); err != nil || t2.ID != tmpl.ID || !slices.Equal(t2.Layers, tmpl.Layers) {
		t.Errorf("after restart: %+v %v", t2, err)
	}
}

func TestStepsAndCache(t *testing.T) {
	runner := &fakeRunner{}
	m, cfg := newManager(t, runner)
	ctx := context.Background()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "app.py"), []byte("print(1)\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	spec := api.TemplateSpec{
		Name: "app",
		Base: "busybox",
		Steps: []api.TemplateStep{
			{Copy: &api.CopyStep{Src: src, Dst: "/srv/app"}},
			{Env: map[string]string{"FOO": "1"}},
			{Run: "write /hello world"},
			{Env: map[string]string{"BAR": "2"}},
			{Run: "noop"},
		},
		Env: map[string]string{"X": "y", "FOO": "override"},
	}
	tmpl, ev := build(t, m, api.BuildTemplateRequest{Spec: &spec})
	steps := ev.steps()
	wantMsgs := []string{"FROM busybox", "COPY " + src + " /srv/app", "ENV FOO=1", "RUN write /hello world", "ENV BAR=2", "RUN noop"}
	if len(steps) != len(wantMsgs) {
		t.Fatalf("steps %+v", steps)
	}
	for i, s := range steps {
		if s.Message != wantMsgs[i] || s.Step != i+1 || s.Steps != 6 {
			t.Errorf("step %d: %+v, want %q", i, s, wantMsgs[i])
		}
	}
	if logs := ev.logs(); !slices.Contains(logs, "running write /hello world") || !slices.Contains(logs, "second line") {
		t.Errorf("logs %q", logs)
	}
	if runner.calls.Load() != 2 {
		t.Errorf("runner called %d times", runner.calls.Load())
	}
	// Layers: run (write), copy, busybox. The noop run adds no layer.
	if len(tmpl.Layers) != 3 {
		t.Fatalf("layers %v", tmpl.Layers)
	}
	if b, err := os.ReadFile(filepath.Join(tmpl.Layers[0], "hello")); err != nil || string(b) != "world" {
		t.Errorf("run layer: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(tmpl.Layers[1], "srv/app/app.py"), &st); err != nil || st.Uid != 100000 || st.Mode&0o777 != 0o640 {
		t.Errorf("copy layer: %+v %v", st, err)
	}
	if want := map[string]string{"FOO": "override", "BAR": "2", "X": "y"}; !maps.Equal(tmpl.Env, want) {
		t.Errorf("env %v, want %v", tmpl.Env, want)
	}
	runner.mu.Lock()
	last := runner.last
	runner.mu.Unlock()
	if !maps.Equal(last.env, map[string]string{"FOO": "1", "BAR": "2"}) || !slices.Equal(last.layers, tmpl.Layers) {
		t.Errorf("last run saw %+v", last)
	}

	// Unchanged: everything cached, no run.
	again, ev := build(t, m, api.BuildTemplateRequest{Name: "app"})
	for _, s := range ev.steps() {
		if !s.Cached {
			t.Errorf("rebuild: step not cached: %+v", s)
		}
	}
	if again.ID != tmpl.ID || runner.calls.Load() != 2 {
		t.Errorf("rebuild: id %s calls %d", again.ID, runner.calls.Load())
	}

	// A changed run step re-runs from there on; earlier steps stay cached.
	spec.Steps[2].Run = "write /hello there"
	changed, ev := build(t, m, api.BuildTemplateRequest{Spec: &spec})
	cached := []bool{}
	for _, s := range ev.steps() {
		cached = append(cached, s.Cached)
	}
	if want := []bool{true, true, true, false, false, false}; !slices.Equal(cached, want) {
		t.Errorf("cached flags %v, want %v", cached, want)
	}
	if changed.ID == tmpl.ID || runner.calls.Load() != 4 || changed.Layers[1] != tmpl.Layers[1] {
		t.Errorf("changed: %+v calls %d", changed, runner.calls.Load())
	}

	// Changed copied content invalidates the copy and every later step.
	os.WriteFile(filepath.Join(src, "app.py"), []byte("print(2)\n"), 0o640)
	recopied, ev := build(t, m, api.BuildTemplateRequest{Name: "app"})
	if s := ev.steps(); s[1].Cached || s[3].Cached || recopied.Layers[1] == changed.Layers[1] || runner.calls.Load() != 6 {
		t.Errorf("after copy change: steps %+v calls %d", s, runner.calls.Load())
	}

	// Force re-runs everything; identical output gives the same layers.
	forced, ev := build(t, m, api.BuildTemplateRequest{Name: "app", Force: true})
	if s := ev.steps(); s[0].Cached || s[3].Cached || forced.ID != recopied.ID || runner.calls.Load() != 8 {
		t.Errorf("force: steps %+v calls %d", s, runner.calls.Load())
	}

	// A template built on "app".
	child := api.TemplateSpec{Name: "child", Base: "app", Steps: []api.TemplateStep{{Run: "write /child yes"}}}
	ct, ev := build(t, m, api.BuildTemplateRequest{Spec: &child})
	if len(ct.Layers) != 4 || !slices.Equal(ct.Layers[1:], forced.Layers) || ct.Env["X"] != "y" {
		t.Errorf("child %+v", ct)
	}
	if s := ev.steps(); len(s) != 2 || s[0].Message != "FROM app" || !s[0].Cached {
		t.Errorf("child steps %+v", s)
	}

	// Registered specs survive a restart.
	m2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m2.Get(ctx, "child"); err != nil || got.ID != ct.ID {
		t.Errorf("after restart: %+v %v", got, err)
	}
	if again, _ := build(t, m2, api.BuildTemplateRequest{Name: "child"}); again.ID != ct.ID || runner.calls.Load() != 9 {
		t.Errorf("rebuild after restart: %s calls %d", again.ID, runner.calls.Load())
	}
}

func TestConcurrentBuildRunsOnce(t *testing.T) {
	runner := &fakeRunner{delay: 300 * time.Millisecond}
	m, _ := newManager(t, runner)
	spec := api.TemplateSpec{Name: "slow", Base: "busybox", Steps: []api.TemplateStep{{Run: "write /f x"}}}
	if err := m.Register(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	// One caller gives up early; the shared build goes on for the others.
	quitter, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	ids := make([]string, 5)
	errs := make([]error, 5)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i == 0 {
				ctx = quitter
			}
			tmpl, err := m.Build(ctx, api.BuildTemplateRequest{Name: "slow"}, nil)
			ids[i], errs[i] = tmpl.ID, err
		}()
	}
	wg.Wait()
	if !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Errorf("quitter: %v", errs[0])
	}
	for i := 1; i < len(ids); i++ {
		if errs[i] != nil || ids[i] != ids[1] || ids[i] == "" {
			t.Errorf("build %d: %s %v", i, ids[i], errs[i])
		}
	}
	if n := runner.calls.Load(); n != 1 {
		t.Errorf("runner called %d times, want 1", n)
	}
}

func TestFailedBuildRegistersNothing(t *testing.T) {
	runner := &fakeRunner{}
	m, cfg := newManager(t, runner)
	spec := api.TemplateSpec{Name: "bad", Base: "busybox", Steps: []api.TemplateStep{{Run: "write /a b"}, {Run: "fail"}}}
	_, err := m.Build(context.Background(), api.BuildTemplateRequest{Spec: &spec}, nil)
	if err == nil || !strings.Contains(err.Error(), "step 3") {
		t.Fatalf("err = %v", err)
	}
	if _, err := m.Get(context.Background(), "bad"); !errdefs.IsNotFound(err) {
		t.Errorf("Get after failure: %v", err)
	}
	// Cancellation while a step runs.
	spec.Steps[1].Run = "block"
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := m.Build(ctx, api.BuildTemplateRequest{Spec: &spec}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled build: %v", err)
	}
	if _, err := m.Get(context.Background(), "bad"); !errdefs.IsNotFound(err) {
		t.Errorf("Get after cancel: %v", err)
	}
	// No scratch directories are left once the build goroutine has ended.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(filepath.Join(cfg.Layers.Root(), "tmp"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scratch left: %v", ents)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Without a runner, run steps fail cleanly.
	m2, err := New(Config{DataDir: t.TempDir(), Layers: cfg.Layers})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Build(context.Background(), api.BuildTemplateRequest{Spec: &spec}, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("no runner: %v", err)
	}
}

func TestValidation(t *testing.T) {
	m, _ := newManager(t, &fakeRunner{})
	ctx := context.Background()
	bad := map[string]api.TemplateSpec{
		"name":          {Name: "Bad Name", Base: "busybox"},
		"empty base":    {Name: "x"},
		"bad suite":     {Name: "x", Base: "debian:Book/worm"},
		"bad package":   {Name: "x", Base: "debian:bookworm+py;rm"},
		"two fields":    {Name: "x", Base: "busybox", Steps: []api.TemplateStep{{Run: "a", Env: map[string]string{"A": "1"}}}},
		"no field":      {Name: "x", Base: "busybox", Steps: []api.TemplateStep{{}}},
		"relative copy": {Name: "x", Base: "busybox", Steps: []api.TemplateStep{{Copy: &api.CopyStep{Src: "rel", Dst: "/x"}}}},
		"bad env":       {Name: "x", Base: "busybox", Env: map[string]string{"A=B": "1"}},
		"self base":     {Name: "x", Base: "x"},
	}
	for name, spec := range bad {
		if err := m.Register(ctx, spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := m.Register(ctx, api.TemplateSpec{Name: "busybox", Base: "debian:bookworm"}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("redefining builtin: %v", err)
	}
	if err := m.Register(ctx, Builtin()[0]); err != nil {
		t.Errorf("registering a builtin as is: %v", err)
	}
	if err := m.Register(ctx, api.TemplateSpec{Name: "orphan", Base: "nope"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown base: %v", err)
	}
	if err := m.Register(ctx, api.TemplateSpec{Name: "a", Base: "busybox"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(ctx, api.TemplateSpec{Name: "b", Base: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(ctx, api.TemplateSpec{Name: "a", Base: "b"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("cycle: %v", err)
	}
	if _, err := m.Build(ctx, api.BuildTemplateRequest{Name: "missing"}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("build missing: %v", err)
	}
	if _, err := m.Build(ctx, api.BuildTemplateRequest{}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty request: %v", err)
	}
	for _, base := range []string{"debian:bookworm+python3,curl", "debootstrap:bookworm", "scratch+busybox", "busybox", "mytemplate"} {
		if _, err := parseBase(base); err != nil {
			t.Errorf("parseBase(%q): %v", base, err)
		}
	}
	if b, _ := parseBase("debian:bookworm+git,curl,git"); b.String() != "debian:bookworm+curl,git" {
		t.Errorf("packages not normalised: %s", b)
	}
}

// TestDebian builds the real builtin debian template with mmdebstrap (needs
// Debian's mirror; 1-3 minutes).
func TestDebian(t *testing.T) {
	testutil.Short(t)
	testutil.RequiresBinary(t, "mmdebstrap")
	m, _ := newManager(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var ev events
	tmpl, err := m.Build(ctx, api.BuildTemplateRequest{Name: "debian"}, ev.add)
	if err != nil {
		t.Fatalf("%v\nlast logs: %q", err, tail(ev.logs(), 20))
	}
	if len(ev.logs()) == 0 {
		t.Error("no mmdebstrap log lines")
	}
	root := tmpl.Layers[0]
	for _, rel := range []string{"usr/bin/python3", "usr/bin/curl", "usr/bin/git", "etc/ssl/certs/ca-certificates.crt", "usr/bin/apt-get"} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, rel), &st); err != nil {
			t.Errorf("%s: %v", rel, err)
		} else if st.Uid != 100000 {
			t.Errorf("%s owned by %d", rel, st.Uid)
		}
	}
	if tmpl.Env["LANG"] != "C.UTF-8" {
		t.Errorf("env %v", tmpl.Env)
	}
	out, err := exec.Command("chroot", root, "python3", "-c", "print(6*7)").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Errorf("python3 in chroot: %q %v", out, err)
	}
	start := time.Now()
	again, err := m.Build(ctx, api.BuildTemplateRequest{Name: "debian"}, nil)
	if err != nil || again.ID != tmpl.ID || time.Since(start) > 2*time.Second {
		t.Errorf("rebuild: %s %v in %v", again.ID, err, time.Since(start))
	}
}

func tail(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// scratchRunner is a fakeRunner that provides the steps' scratch dirs on
// another filesystem (a tmpfs, as a capped loop filesystem would be).
type scratchRunner struct {
	fakeRunner
	root     string
	given    []string
	released atomic.Int32
}

func (s *scratchRunner) StepScratch(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp(s.root, "step-")
	if err != nil {
		return "", nil, err
	}
	s.given = append(s.given, dir)
	return dir, func() { s.released.Add(1); _ = os.RemoveAll(dir) }, nil
}

// A StepScratcher provides each run step's upper and work dirs: the step
// writes there, the layer is made from it (copied across filesystems),
// and the dir is released after.
func TestStepScratcher(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	runner := &scratchRunner{root: root}
	m, _ := newManager(t, runner)
	tmpl, _ := build(t, m, api.BuildTemplateRequest{Spec: &api.TemplateSpec{
		Name:  "scratched",
		Base:  "busybox",
		Steps: []api.TemplateStep{{Run: "write /hello world"}},
	}})
	if len(runner.given) != 1 || runner.released.Load() != 1 {
		t.Fatalf("scratch dirs given %v, released %d", runner.given, runner.released.Load())
	}
	if _, err := os.Stat(runner.given[0]); !os.IsNotExist(err) {
		t.Fatalf("scratch dir left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tmpl.Layers[0], "hello")); err != nil || string(b) != "world" {
		t.Fatalf("top layer's /hello: %q, %v", b, err)
	}
}
