package native

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CPU yield: CPU-bound sandboxes step back for interactive ones.
//
// Under contention EEVDF shares the CPU fairly, but a sandbox answering an
// agent's commands still waits for a sandbox that is always runnable (a
// build, a busy loop): the kernel protects a running task's slice until a
// tick notices it is used up (4 ms at 250 Hz), so each wake-up on an
// exec's path (the daemon, the guest, the command, the client) can lose a
// tick to a hog, and the command's own CPU soon puts its sandbox past its
// fair share, behind every hog in deadline order.
//
// The yielder watches the running sandboxes and marks those with a task
// that was running or waiting to run (schedstat run+wait) for nearly all of
// two consecutive windows as SCHED_IDLE, through their cgroup's cpu.idle:
// any other sandbox's task then preempts them at once, and they share what
// is left among themselves by weight. A sandbox stops yielding as soon as
// no task of it is runnable for half a window. While any sandbox yields,
// the sandboxes' parent cgroup yields to the host as well, so that the
// daemon and clients on the host preempt a hog at once too; it stops when
// no sandbox under the parent yields (whichever daemon's: the parent may
// be shared, and the kernel's cpu.idle files are the shared state).
//
// The price: while it yields, a CPU-bound sandbox gets next to nothing
// while interactive sandboxes or host processes want the CPU (weight 3
// against 1024), and a CPU-bound load of many short-lived processes (each
// gone before two windows) is never seen as CPU-bound.

const (
	yieldWindow = 250 * time.Millisecond
	// yieldEnter is the share of a window a task must have been running
	// or runnable for the window to count as busy; yieldLeave is the share
	// below which no task may be for a yielding sandbox to stop yielding.
	yieldEnter = 0.9
	yieldLeave = 0.5
	// yieldAfter busy windows in a row make a sandbox yield; yieldQuiet
	// quiet ones make it stop.
	yieldAfter = 1
	yieldQuiet = 2
	// The sandboxes yield to the host only while the host's own processes
	// use less than hostHeavy of the machine's CPU: past that (a build on
	// the host, say) they compete with it fairly again, until its use falls
	// below hostLight.
	hostHeavy = 0.5
	hostLight = 0.35
)

// yieldState is the classification of one sandbox, fed one window at a time.
type yieldState struct {
	busy     int // consecutive busy windows
	quiet    int // consecutive quiet windows while yielding
	yielding bool
}

// next takes the largest run+wait share of any task in the window just
// ended and whether a task was runnable when it ended, and reports whether
// the sandbox should yield from now on. A starved task's waiting is only
// accounted when it next runs (schedstat's run_delay), so a yielding
// sandbox's share swings between nothing and several windows' worth: it
// stops yielding only after yieldQuiet windows in a row below yieldLeave
// with no task runnable at their end.
func (s *yieldState) next(maxShare float64, runnable bool) bool {
	switch {
	case s.yielding:
		if maxShare >= yieldLeave || runnable {
			s.quiet = 0
			break
		}
		s.quiet++
		if s.quiet >= yieldQuiet {
			s.yielding, s.busy, s.quiet = false, 0, 0
		}
	case maxShare >= yieldEnter:
		s.busy++
		s.yielding = s.busy >= yieldAfter
	default:
		s.busy = 0
	}
	return s.yielding
}

// yieldBox is a sandbox as the yielder sees it. Its fields other than sb,
// idleFile and tasksFile belong to the sampling goroutine.
type yieldBox struct {
	sb        *sandbox
	idleFile  string // the cgroup's cpu.idle
	tasksFile string // the cgroup's thread list (v1 tasks, v2 cgroup.threads)

	state     yieldState
	prev      map[int]uint64 // tid → run+wait ns at the last sample
	stats     statFiles      // open schedstat files of its tasks
	prevAt    time.Time
	prevUsage int64 // cgroup CPU time (ns) at the last sample
	written   bool  // cpu.idle was written once, with applied
	applied   bool
}

// yielder runs the CPU yield policy for one backend.
type yielder struct {
	log        *slog.Logger
	parentDir  string    // the sandboxes' parent in the cpu hierarchy
	parentIdle string    // its cpu.idle
	parentCPU  *counters // its CPU time
	stop, done chan struct{}
	closing    sync.Once

	// mu guards boxes.
	mu    sync.Mutex
	boxes map[*sandbox]*yieldBox

	// Owned by the sampling goroutine.
	open      map[*yieldBox]bool // boxes holding statFiles
	active    int                // sandboxes that used CPU in the last window
	parentOn  bool               // this yielder last set the parent yielding
	host      hostLoad
	hostHeavy bool
}

// hostLoad measures the CPU the host's processes, the sandboxes' parent
// excepted, use between two samples.
type hostLoad struct {
	busy, parent int64 // ns: all CPUs' busy time (/proc/stat), the parent's
	at           time.Time
}

// share returns the share of the machine's CPU the host's own processes
// used since the last call (ok false on the first call or a failed read).
func (h *hostLoad) share(now time.Time, parent *counters) (float64, bool) {
	busy, err := procStatBusy()
	if err != nil {
		return 0, false
	}
	par, err := parent.read(cpuCounter)
	if err != nil {
		return 0, false
	}
	prev := *h
	h.busy, h.parent, h.at = busy, par, now
	window := now.Sub(prev.at)
	if prev.at.IsZero() || window <= 0 {
		return 0, false
	}
	host := float64((busy - prev.busy) - (par - prev.parent))
	return max(host, 0) / (float64(window) * float64(goruntime.NumCPU())), true
}

// procStatBusy is the time (ns) all CPUs spent busy since boot: user, nice,
// system, irq, softirq and steal from /proc/stat (guest time is in user).
func procStatBusy() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
		n, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		ticks += n
	}
	return ticks * (int64(time.Second) / userHZ), nil
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// newYielder returns a running yielder for the sandboxes under parentDir
// (a directory of the cpu hierarchy) whose CPU time parentCPU reads, or
// nil when the kernel has no cpu.idle (before 5.15).
func newYielder(parentDir string, parentCPU *counters, log *slog.Logger) *yielder {
	if !kernelAtLeast(5, 15) {
		log.Info("CPU yield off: the kernel has no cgroup cpu.idle (5.15 or later needed)")
		return nil
	}
	y := &yielder{
		log:        log,
		parentDir:  parentDir,
		parentIdle: filepath.Join(parentDir, "cpu.idle"),
		parentCPU:  parentCPU,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		boxes:      map[*sandbox]*yieldBox{},
		open:       map[*yieldBox]bool{},
	}
	// A daemon that died while sandboxes yielded left the parent yielding:
	// the first window clears it unless some cgroup under it yields.
	y.parentOn = readFlag(y.parentIdle)
	go y.loop()
	return y
}

// add starts watching s. Safe for concurrent use; a nil yielder ignores it.
func (y *yielder) add(s *sandbox) {
	if y == nil {
		return
	}
	idle, tasks := s.cg.cpuFiles()
	if idle == "" {
		return // no cpu controller
	}
	y.mu.Lock()
	y.boxes[s] = &yieldBox{sb: s, idleFile: idle, tasksFile: tasks}
	y.mu.Unlock()
}

// remove stops watching s. Safe for concurrent use.
func (y *yielder) remove(s *sandbox) {
	if y == nil {
		return
	}
	y.mu.Lock()
	delete(y.boxes, s)
	y.mu.Unlock()
}

// close stops the sampling goroutine and releases the sandboxes it made
// yield (and the parent, unless another daemon's sandboxes yield): without
// the policy running, nothing would release them. Idempotent.
func (y *yielder) close() {
	if y == nil {
		return
	}
	y.closing.Do(func() { close(y.stop) })
	<-y.done
	y.mu.Lock()
	defer y.mu.Unlock()
	for _, b := range y.boxes {
		if b.applied {
			_ = writeFlag(b.idleFile, false)
			b.applied = false
			b.sb.cpuBound.Store(false)
		}
	}
	y.updateParent(0, false)
	y.parentCPU.close()
	for b := range y.open {
		b.stats.closeAll()
	}
	clear(y.open)
}

func (y *yielder) loop() {
	defer close(y.done)
	t := time.NewTicker(yieldWindow)
	defer t.Stop()
	for {
		select {
		case <-y.stop:
			return
		case now := <-t.C:
			y.sample(now)
		}
	}
}

// sample classifies every watched sandbox over the window ending at now
// and writes the cpu.idle files that change.
func (y *yielder) sample(now time.Time) {
	y.mu.Lock()
	boxes := make([]*yieldBox, 0, len(y.boxes))
	for _, b := range y.boxes {
		boxes = append(boxes, b)
	}
	y.mu.Unlock()

	// A sandbox that got less than a sliver of the CPU cannot have had a
	// task running or waiting all along unless the CPU is shared among
	// very many: the sliver shrinks with the number of sandboxes that ran.
	sliver := 0.01
	if y.active > 0 {
		sliver = min(sliver, 0.5*float64(goruntime.NumCPU())/float64(y.active))
	}
	active, yielding := 0, 0
	listed := make(map[*yieldBox]bool, len(boxes))
	budget := maxStatFiles
	for b := range y.open {
		budget -= len(b.stats)
	}
	for _, b := range boxes {
		listed[b] = true
		before := len(b.stats)
		share, runnable, used, gone := b.maxShare(now, sliver, budget > 0)
		budget -= len(b.stats) - before
		if len(b.stats) > 0 {
			y.open[b] = true
		} else {
			delete(y.open, b)
		}
		if gone {
			b.stats.closeAll()
			delete(y.open, b)
			y.remove(b.sb)
			continue
		}
		if used {
			active++
		}
		want := b.state.next(share, runnable)
		if !b.written || want != b.applied {
			if err := writeFlag(b.idleFile, want); err != nil {
				if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENODEV) {
					y.log.Warn("setting cpu.idle", "sandbox", b.sb.ID(), "err", err)
				}
				continue
			}
			if b.written || want {
				y.log.Info("sandbox CPU class changed", "sandbox", b.sb.ID(), "cpu_bound", want)
			}
			b.written, b.applied = true, want
			b.sb.cpuBound.Store(want)
		}
		if want {
			yielding++
		}
	}
	for b := range y.open {
		if !listed[b] { // removed (destroyed) since the last window
			b.stats.closeAll()
			delete(y.open, b)
		}
	}
	y.active = active
	if share, ok := y.host.share(now, y.parentCPU); ok {
		switch {
		case !y.hostHeavy && share >= hostHeavy:
			y.hostHeavy = true
			if yielding > 0 {
				y.log.Info("the host is busy: sandboxes share the CPU with it again", "host_share", share)
			}
		case y.hostHeavy && share < hostLight:
			y.hostHeavy = false
		}
	}
	y.updateParent(yielding, y.hostHeavy)
}

// maxShare returns the largest share of the window that any task of the
// sandbox spent running or runnable, whether (for a yielding sandbox that
// was quiet) a task is runnable now, whether the sandbox used CPU at all,
// and gone when its cgroup no longer exists. A paused sandbox has share 0.
// keepOpen lets it keep its tasks' schedstat files open.
func (b *yieldBox) maxShare(now time.Time, sliver float64, keepOpen bool) (share float64, runnable, used, gone bool) {
	if b.sb.paused.Load() {
		// Frozen tasks use no CPU: the counter is not read, and the
		// window after the thaw starts here.
		if !b.prevAt.IsZero() {
			b.prevAt = now
		}
		b.prev = nil
		b.stats.closeAll()
		return 0, false, false, false
	}
	usage, err := b.sb.cg.cpuUsage()
	if err != nil {
		return 0, false, false, errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) || errors.Is(err, os.ErrClosed)
	}
	window := now.Sub(b.prevAt)
	delta := usage - b.prevUsage
	first := b.prevAt.IsZero()
	b.prevUsage, b.prevAt = usage, now
	used = !first && delta > 0
	// A yielding sandbox is starved by design: it is read whatever it got.
	if first || window <= 0 || (!b.state.yielding && float64(delta) < sliver*float64(window)) {
		b.prev = nil
		b.stats.closeAll()
		return 0, false, used, false
	}
	tids, err := readTids(b.tasksFile)
	if err != nil {
		return 0, false, used, errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)
	}
	if b.stats == nil {
		b.stats = statFiles{}
	}
	cur := make(map[int]uint64, len(tids))
	for _, tid := range tids {
		v, ok := b.stats.read(tid, keepOpen)
		if !ok {
			continue
		}
		cur[tid] = v
		if p, seen := b.prev[tid]; seen && v >= p {
			share = max(share, float64(v-p)/float64(window))
		}
	}
	b.stats.keep(cur)
	b.prev = cur
	if b.state.yielding && share < yieldLeave {
		for tid := range cur {
			if taskRunnable(tid) {
				runnable = true
				break
			}
		}
	}
	return share, runnable, used, false
}

// maxStatFiles bounds the schedstat files a yielder keeps open (beyond it,
// each read opens and closes its file).
const maxStatFiles = 4096

// statFiles are open /proc/<tid>/schedstat files of one sandbox's tasks,
// by tid: raw descriptors read with pread, since opening the file (a path
// walk through procfs) cost most of the sampler's time.
type statFiles map[int]int

// read returns the nanoseconds task tid has spent running and waiting to
// run (the first two fields of its schedstat), through a kept descriptor
// when keepOpen or one already is.
func (f statFiles) read(tid int, keepOpen bool) (uint64, bool) {
	fd, ok := f[tid]
	if !ok {
		var err error
		fd, err = unix.Open("/proc/"+strconv.Itoa(tid)+"/schedstat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, false
		}
		if keepOpen {
			f[tid] = fd
		} else {
			defer unix.Close(fd)
		}
	}
	var buf [128]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if err != nil || n <= 0 {
		if ok || keepOpen { // the task is gone (ESRCH): drop its file
			unix.Close(fd)
			delete(f, tid)
		}
		return 0, false
	}
	return parseSchedstat(buf[:n])
}

// keep closes the files of tasks not in live.
func (f statFiles) keep(live map[int]uint64) {
	for tid, fd := range f {
		if _, ok := live[tid]; !ok {
			unix.Close(fd)
			delete(f, tid)
		}
	}
}

func (f statFiles) closeAll() {
	for tid, fd := range f {
		unix.Close(fd)
		delete(f, tid)
	}
}

// updateParent makes the parent yield to the host while any sandbox under
// it yields and the host is not busy itself. Going yielding is
// re-asserted every window (another daemon sharing the parent may have
// cleared it). Going back for want of yielding sandboxes is decided on the
// cpu.idle files of every cgroup under the parent, since other daemons'
// sandboxes may still yield; for a busy host, at once.
func (y *yielder) updateParent(yielding int, hostBusy bool) {
	if yielding > 0 && !hostBusy {
		if !y.parentOn || !readFlag(y.parentIdle) {
			if err := writeFlag(y.parentIdle, true); err != nil {
				y.log.Warn("setting cpu.idle of the sandboxes' parent", "err", err)
				return
			}
			if !y.parentOn {
				y.log.Info("sandboxes yield to the host while some are CPU-bound", "yielding", yielding)
			}
			y.parentOn = true
		}
		return
	}
	if !y.parentOn {
		return
	}
	if !hostBusy {
		entries, err := os.ReadDir(y.parentDir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() && readFlag(filepath.Join(y.parentDir, e.Name(), "cpu.idle")) {
				y.parentOn = false
				return // another daemon's sandbox still yields
			}
		}
	}
	if err := writeFlag(y.parentIdle, false); err != nil {
		y.log.Warn("clearing cpu.idle of the sandboxes' parent", "err", err)
		return
	}
	y.parentOn = false
	if !hostBusy {
		y.log.Info("no sandbox is CPU-bound: sandboxes share the CPU with the host again")
	}
}

// parseSchedstat returns run + wait from a schedstat line ("run wait
// timeslices", nanoseconds).
func parseSchedstat(b []byte) (uint64, bool) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, false
	}
	run, err1 := strconv.ParseUint(string(f[0]), 10, 64)
	wait, err2 := strconv.ParseUint(string(f[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return run + wait, true
}

// taskRunnable reports whether task tid is running or waiting to run
// (state R in /proc/<tid>/stat).
func taskRunnable(tid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and
	// may itself contain ") ".
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'R'
}

// readTids reads a cgroup thread list (one id per line).
func readTids(file string) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, l := range bytes.Fields(b) {
		if n, err := strconv.Atoi(string(l)); err == nil {
			out = append(out, n)
		}
	}
	// On v2 a sandbox's processes live in its guest's per-exec cgroups
	// (execcgroup.go), below the sandbox's: their threads count too.
	// (v1 "tasks" lists them already: per-exec cgroups are v2 only.)
	if filepath.Base(file) == "cgroup.threads" {
		ents, _ := os.ReadDir(filepath.Dir(file))
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			sub, err := readTids(filepath.Join(filepath.Dir(file), e.Name(), "cgroup.threads"))
			if err == nil {
				out = append(out, sub...)
			}
		}
	}
	return out, nil
}

func writeFlag(file string, on bool) error {
	v := []byte("0")
	if on {
		v = []byte("1")
	}
	return os.WriteFile(file, v, 0)
}

func readFlag(file string) bool {
	b, err := os.ReadFile(file)
	return err == nil && string(bytes.TrimSpace(b)) == "1"
}

// kernelAtLeast reports whether the running kernel is major.minor or later.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return releaseAtLeast(unix.ByteSliceToString(u.Release[:]), major, minor)
}

// releaseAtLeast reports whether the kernel release string rel (uname -r)
// is major.minor or later.
func releaseAtLeast(rel string, major, minor int) bool {
	var v [2]int
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return false
	}
	for i := range v {
		digits := strings.TrimRightFunc(parts[i], func(r rune) bool { return r < '0' || r > '9' })
		n, err := strconv.Atoi(digits)
		if err != nil {
			return false
		}
		v[i] = n
	}
	return v[0] > major || (v[0] == major && v[1] >= minor)
}
