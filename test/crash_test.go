package test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// crashLedger is what the workload was told succeeded: acknowledged
// creates, deletes and checkpoints.
type crashLedger struct {
	mu      sync.Mutex
	created map[string]bool // acked creates
	deleted map[string]bool // acked deletes
	// deleting are deletes sent but not acknowledged (the daemon died
	// first): either outcome is correct.
	deleting    map[string]bool
	checkpoints map[string]string // acked checkpoint id -> sandbox id
}

func (l *crashLedger) live() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id := range l.created {
		if !l.deleted[id] {
			out = append(out, id)
		}
	}
	return out
}

// crashReport collects what the crash test found wrong so that the
// reasons, with the seed, can be printed again after everything else the
// test prints: the daemon log dumped at the end is long, and a CI log may
// keep only its end.
type crashReport struct {
	t    *testing.T
	mu   sync.Mutex
	msgs []string
}

// errorf reports a failure in one line; detail (daemon log lines) is logged
// after it, not inside it.
func (r *crashReport) errorf(detail, format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
	r.t.Error(msg)
	if detail != "" {
		r.t.Logf("daemon log lines about it:\n%s", detail)
	}
}

// summary is every reason reported, one per line.
func (r *crashReport) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.msgs) == 0 {
		return "  (see the errors above)"
	}
	return "  " + strings.Join(r.msgs, "\n  ")
}

// TestCrashDurability SIGKILLs the daemon at 20 random points of a
// concurrent workload (create, exec, checkpoint, pause, delete) and
// restarts it each time. After every restart: nothing acknowledged is lost,
// every listed sandbox is in the state it claims (running ones answer exec,
// paused ones are frozen, hibernated ones have no cgroup), and nothing is
// leaked (cgroups and their processes, guest sockets, sandbox dirs, host
// mounts, zygotes). The daemon gets a cgroup parent of its own so that
// leaks are attributable. AGENTBOX_CRASH_SEED replays a run.
func TestCrashDurability(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("AGENTBOX_CRASH_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = n
	}
	t.Logf("seed %d (AGENTBOX_CRASH_SEED=%d replays it)", seed, seed)
	r := &crashReport{t: t}
	// Registered before the daemon's cleanup, so it runs after it: the
	// reasons come after the daemon log dump.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d (AGENTBOX_CRASH_SEED=%d replays it):\n%s", seed, seed, r.summary())
		}
	})
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	parent := "abx-crash-" + randHex(4)
	t.Setenv("AGENTBOX_CGROUP_PARENT", parent)
	t.Cleanup(func() { removeCgroupParent(t, parent) })
	d := newDaemon(t)
	led := &crashLedger{created: map[string]bool{}, deleted: map[string]bool{}, deleting: map[string]bool{}, checkpoints: map[string]string{}}

	const rounds, workers = 20, 3
	for round := 0; round < rounds; round++ {
		c := d.client
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			wg.Add(1)
			go func() {
				defer wg.Done()
				crashWorker(c, led, wrng, stop)
			}()
		}
		delay := time.Duration(50+rng.IntN(900)) * time.Millisecond
		time.Sleep(delay)
		d.stop(syscall.SIGKILL)
		close(stop)
		wg.Wait()
		d.start()
		checkCrashInvariants(r, d, led, parent, fmt.Sprintf("round %d (killed after %v)", round, delay))
		if t.Failed() {
			return
		}
	}
	led.mu.Lock()
	t.Logf("acknowledged: %d creates, %d deletes, %d checkpoints", len(led.created), len(led.deleted), len(led.checkpoints))
	led.mu.Unlock()

	// Everything deleted through the API leaves nothing behind.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sbs, err := d.client.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if err := sb.Delete(ctx); err != nil {
			r.errorf("", "delete %s: %v", sb.ID(), err)
		}
	}
	for _, dir := range cgroupChildren(parent) {
		if !strings.HasPrefix(filepath.Base(dir), ".zygote-") {
			r.errorf("", "cgroup left after deleting every sandbox: %s", dir)
		}
	}
	d.stop(syscall.SIGTERM)
	// With the daemon gone its zygotes exit; its successor sweeps them.
	d.start()
	time.Sleep(200 * time.Millisecond)
	d.stop(syscall.SIGKILL)
	for _, dir := range cgroupChildren(parent) {
		if pids := cgroupPids(dir); len(pids) > 0 && !strings.HasPrefix(filepath.Base(dir), ".zygote-") {
			r.errorf("", "processes %v left in %s", pids, dir)
		}
	}
	d.start()
}

// crashWorker runs random operations against c until stop is closed,
// recording what the daemon acknowledged.
func crashWorker(c *agentbox.Client, led *crashLedger, rng *rand.Rand, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		live := led.live()
		var id string
		if len(live) > 0 {
			id = live[rng.IntN(len(live))]
		}
		op := rng.IntN(10)
		switch {
		case id == "" || (op < 3 && len(live) < 8):
			sb, err := c.Create(ctx, agentbox.SandboxSpec{Template: "busybox"})
			if err == nil {
				led.mu.Lock()
				led.created[sb.ID()] = true
				led.mu.Unlock()
			}
		case op < 6:
			_, _ = c.Sandbox(id).Run(ctx, "echo x >> /root/log && wc -l < /root/log")
		case op < 7:
			if ck, err := c.Sandbox(id).Checkpoint(ctx, ""); err == nil {
				led.mu.Lock()
				led.checkpoints[ck.ID] = id
				led.mu.Unlock()
			}
		case op < 9:
			_ = c.Sandbox(id).Pause(ctx)
		default:
			led.mu.Lock()
			led.deleting[id] = true
			led.mu.Unlock()
			if err := c.Sandbox(id).Delete(ctx); err == nil || agentbox.IsNotFound(err) {
				led.mu.Lock()
				led.deleted[id] = true
				led.mu.Unlock()
			}
		}
		cancel()
	}
}

func checkCrashInvariants(r *crashReport, d *daemon, led *crashLedger, parent, when string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sbs, err := d.client.List(ctx, nil)
	if err != nil {
		r.errorf("", "%s: list: %v", when, err)
		r.t.FailNow()
	}
	listed := map[string]string{}
	for _, sb := range sbs {
		listed[sb.ID()] = sb.Info().State
	}
	led.mu.Lock()
	for id := range led.created {
		if !led.deleted[id] && listed[id] == "" && led.deleting[id] {
			// An unacknowledged delete took effect: count it as done.
			led.deleted[id] = true
			continue
		}
		if !led.deleted[id] && listed[id] == "" {
			r.errorf(logLinesWith(d, id), "%s: acknowledged sandbox %s lost", when, id)
		}
	}
	for id := range led.deleted {
		if listed[id] != "" {
			r.errorf(logLinesWith(d, id), "%s: sandbox %s listed after an acknowledged delete", when, id)
		}
	}
	cks := make(map[string]string, len(led.checkpoints))
	for k, v := range led.checkpoints {
		cks[k] = v
	}
	led.mu.Unlock()
	for cid, sid := range cks {
		if _, err := d.client.Checkpoint(ctx, cid); err != nil {
			r.errorf(logLinesWith(d, cid), "%s: acknowledged checkpoint %s of %s lost: %v", when, cid, sid, err)
		}
	}

	// States match reality.
	for id, state := range listed {
		switch state {
		case api.StateRunning:
			if fs := freezerState(parent, id); fs != "" && fs != "THAWED" {
				r.errorf(logLinesWith(d, id), "%s: running sandbox %s has freezer state %s", when, id, fs)
			}
			res, err := d.client.Sandbox(id).Run(ctx, "echo alive")
			if err != nil || strings.TrimSpace(string(res.Stdout)) != "alive" {
				r.errorf(logLinesWith(d, id), "%s: running sandbox %s does not answer exec: %v", when, id, err)
			}
		case api.StatePaused:
			if fs := freezerState(parent, id); fs != "FROZEN" {
				r.errorf(logLinesWith(d, id), "%s: paused sandbox %s has freezer state %q", when, id, fs)
			}
		case api.StateHibernated:
			if dirs := cgroupDirsUnder(parent, id); len(dirs) > 0 {
				r.errorf(logLinesWith(d, id), "%s: hibernated sandbox %s has cgroups %v", when, id, dirs)
			}
		default:
			r.errorf(logLinesWith(d, id), "%s: sandbox %s listed in state %q", when, id, state)
		}
	}

	// Nothing leaked: every cgroup, socket and sandbox dir belongs to a
	// listed sandbox (or to one of at most two zygotes).
	var zygotes []string
	for _, dir := range cgroupChildren(parent) {
		name := filepath.Base(dir)
		if strings.HasPrefix(name, ".zygote-") {
			zygotes = append(zygotes, dir)
			continue
		}
		if listed[name] == "" {
			r.errorf(logLinesWith(d, name), "%s: cgroup %s (processes %v) belongs to no listed sandbox", when, dir, cgroupPids(dir))
		}
	}
	if n := len(hierarchyRoots()); n > 0 && len(zygotes)/n > 2 {
		r.errorf("", "%s: %d zygote cgroups over %d hierarchies, want at most 2 zygotes: %v", when, len(zygotes), n, zygotes)
	}
	socks, _ := filepath.Glob(filepath.Join(filepath.Dir(d.socket), "sb", "*"))
	var zsocks []string
	for _, s := range socks {
		name := filepath.Base(s)
		if strings.HasPrefix(name, ".zygote-") {
			zsocks = append(zsocks, name)
			continue
		}
		if listed[strings.TrimSuffix(name, ".sock")] == "" {
			r.errorf(logLinesWith(d, strings.TrimSuffix(name, ".sock")), "%s: guest socket %s belongs to no listed sandbox", when, s)
		}
	}
	if len(zsocks) > 2 {
		r.errorf("", "%s: %d zygote sockets, want at most 2: %v", when, len(zsocks), zsocks)
	}
	dirs, _ := os.ReadDir(filepath.Join(d.dataDir, "sandboxes"))
	for _, e := range dirs {
		if !strings.HasPrefix(e.Name(), ".") && listed[e.Name()] == "" {
			r.errorf(logLinesWith(d, e.Name()), "%s: sandbox dir %s belongs to no listed sandbox", when, e.Name())
		}
	}
	// The daemon's own shared bind of its sandboxes dir (disk quotas) is
	// expected; a mount below it must be a listed sandbox's.
	sbDir := filepath.Join(d.dataDir, "sandboxes")
	for _, m := range hostMountsUnder(d.dir) {
		if m == sbDir {
			continue
		}
		if rest, ok := strings.CutPrefix(m, sbDir+"/"); ok && listed[strings.SplitN(rest, "/", 2)[0]] != "" {
			continue
		}
		r.errorf("", "%s: host mount %s belongs to no listed sandbox", when, m)
	}
}

// hierarchyRoots are the cgroup hierarchies sandboxes join: the v1
// controllers or the unified root.
func hierarchyRoots() []string {
	var out []string
	for _, c := range []string{"freezer", "pids", "memory", "cpu,cpuacct", "cpu", "cpuacct"} {
		p := filepath.Join("/sys/fs/cgroup", c)
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		out = []string{"/sys/fs/cgroup"}
	}
	return out
}

// cgroupChildren lists the cgroup dirs directly under parent in every
// hierarchy.
func cgroupChildren(parent string) []string {
	var out []string
	for _, root := range hierarchyRoots() {
		entries, _ := os.ReadDir(filepath.Join(root, parent))
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, filepath.Join(root, parent, e.Name()))
			}
		}
	}
	return out
}

func cgroupDirsUnder(parent, id string) []string {
	var out []string
	for _, root := range hierarchyRoots() {
		if _, err := os.Stat(filepath.Join(root, parent, id)); err == nil {
			out = append(out, filepath.Join(root, parent, id))
		}
	}
	return out
}

func cgroupPids(dir string) []string {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return strings.Fields(string(b))
}

// freezerState is the v1 freezer.state of the sandbox (FROZEN, THAWED),
// or on v2 FROZEN/THAWED from cgroup.freeze; "" when there is no cgroup.
func freezerState(parent, id string) string {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", parent, id, "freezer.state")); err == nil {
		return strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", parent, id, "cgroup.freeze")); err == nil {
		if strings.TrimSpace(string(b)) == "1" {
			return "FROZEN"
		}
		return "THAWED"
	}
	return ""
}

// hostMountsUnder returns the mount points in the host mount namespace at
// or below dir.
func hostMountsUnder(dir string) []string {
	f, err := os.Open("/proc/1/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// removeCgroupParent removes the (by now empty) test cgroup parent, also
// from the unified hierarchy of a hybrid host (guests' delegated cgroups).
func removeCgroupParent(t *testing.T, parent string) {
	roots := hierarchyRoots()
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/unified")
	}
	for _, root := range roots {
		dir := filepath.Join(root, parent)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				_ = os.WriteFile(filepath.Join(dir, e.Name(), "cgroup.procs"), nil, 0)
				if err := syscall.Rmdir(filepath.Join(dir, e.Name())); err != nil {
					t.Logf("removing %s: %v", filepath.Join(dir, e.Name()), err)
				}
			}
		}
		_ = syscall.Rmdir(dir)
	}
}

// logLinesWith returns the daemon log lines that mention s.
func logLinesWith(d *daemon, s string) string {
	b, _ := os.ReadFile(d.logPath)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
