package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/guest/client"
)

// The parts of the gVisor exec round trip, measured beside it in the same
// run so that docs/BENCHMARKS-gvisor.md can say what bounds it:
//
//   - the guest's version call straight on the sandbox's socket: connect
//     through the sentry (--host-uds), one request, one reply, no process:
//     the transport's own round trip;
//   - exec /bin/true straight on the sandbox's socket: the round trip
//     without the daemon and its HTTP edge;
//   - one fork+exec+wait of /bin/true inside the sandbox, timed from inside
//     by a busybox sh loop of spawnLoop iterations (the exec's total over
//     spawnLoop): what the sentry charges for a process, whoever starts it;
//   - the same loop on a native sandbox, for the ratio.
//
// Each is measured on a gVisor sandbox and, for the ratios, on a native one
// of the same daemon.

const (
	keyGvVersion     = "agentbox-gvisor-guest-version"
	keyGvGuestExec   = "agentbox-gvisor-guest-exec"
	keyGvSpawn       = "gvisor-sentry-spawn"
	keyGvFork        = "gvisor-sentry-fork"
	keyNativeVersion = "agentbox-native-guest-version"
	keyNativeSpawn   = "native-spawn"

	// spawnLoop is how many /bin/true one spawn sample runs.
	spawnLoop = 100
)

func init() {
	ratios = append(ratios,
		ratio{Label: "agentbox gvisor exec round trip vs sentry spawn of /bin/true", Num: keyGvExec, Den: keyGvSpawn},
		ratio{Label: "gvisor sentry spawn vs native spawn of /bin/true", Num: keyGvSpawn, Den: keyNativeSpawn},
		ratio{Label: "gvisor sentry fork alone vs fork+exec of /bin/true", Num: keyGvFork, Den: keyGvSpawn},
		ratio{Label: "gvisor guest transport round trip vs native", Num: keyGvVersion, Den: keyNativeVersion},
	)
}

// measureGvisorExecParts measures the parts above on sandbox gvID (gVisor)
// and nativeID (native, "" to leave those rows out) of daemon d.
func measureGvisorExecParts(ctx context.Context, b *bench, d *daemon, gvID, nativeID string) []result {
	sock := func(id string) string { return filepath.Join(d.dir, "sb", id+".sock") }
	gv := client.New(sock(gvID))
	out := []result{
		measureGuestVersion(ctx, b, gv, keyGvVersion, "gvisor guest: version call on the sandbox's socket (connect, request, reply; no process)"),
		measureGuestExec(ctx, b, gv),
		measureSpawn(ctx, b, gv, keyGvSpawn, "gvisor sentry: one fork+exec+wait of /bin/true inside the sandbox", "/bin/true"),
		measureSpawn(ctx, b, gv, keyGvFork, "gvisor sentry: one fork+exit+wait (a subshell, no exec) inside the sandbox", "(:)"),
	}
	if nativeID == "" {
		return out
	}
	nat := client.New(sock(nativeID))
	return append(out,
		measureGuestVersion(ctx, b, nat, keyNativeVersion, "native guest: version call on the sandbox's socket (connect, request, reply; no process)"),
		measureSpawn(ctx, b, nat, keyNativeSpawn, "native: one fork+exec+wait of /bin/true inside the sandbox", "/bin/true"),
	)
}

func measureGuestVersion(ctx context.Context, b *bench, c *client.Client, key, name string) result {
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		_, err := c.Version(ctx)
		return err
	}, nil)
	return measured(key, groupGvisor, name, "a fresh connection per call, as the daemon makes one per operation; no daemon, no HTTP", samples, err)
}

func measureGuestExec(ctx context.Context, b *bench, c *client.Client) result {
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		_, err := guestExec(ctx, c, "/bin/true")
		return err
	}, nil)
	return measured(keyGvGuestExec, groupGvisor, "gvisor guest: exec /bin/true on the sandbox's socket to its exit frame",
		"the gvisor exec round trip without the daemon and its HTTP edge", samples, err)
}

// measureSpawn times a busybox sh loop of spawnLoop times body inside the
// sandbox; a sample is the loop's own time over spawnLoop: the exec of the
// loop minus the median exec of a loop of zero iterations (busybox has no
// clock finer than a second to time it from inside).
func measureSpawn(ctx context.Context, b *bench, c *client.Client, key, name, body string) result {
	loop := func(n int) string {
		return "i=0; while [ $i -lt " + strconv.Itoa(n) + " ]; do " + body + "; i=$((i+1)); done"
	}
	empty, err := timeN(ctx, b.n, b.warmup, func(int) error {
		_, err := guestExec(ctx, c, "/bin/sh", "-c", loop(0))
		return err
	}, nil)
	if err != nil {
		return measured(key, groupGvisor, name, "", nil, err)
	}
	base := summarize(empty).Median
	samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
		_, err := guestExec(ctx, c, "/bin/sh", "-c", loop(spawnLoop))
		return err
	}, nil)
	for i, s := range samples {
		samples[i] = max(s-base, 0) / spawnLoop
	}
	note := fmt.Sprintf("busybox sh loop of %d × %s, (exec of the loop − exec of an empty loop, median %s) / %d; the shell forks (no vfork)", spawnLoop, body, ms(base), spawnLoop)
	return measured(key, groupGvisor, name, note, samples, err)
}

// guestExec runs argv through the guest client and waits for its exit; a
// non-zero exit is an error.
func guestExec(ctx context.Context, c *client.Client, argv ...string) (time.Duration, error) {
	start := time.Now()
	s, err := c.Exec(ctx, api.ExecRequest{Cmd: argv})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if err != nil {
			return 0, err
		}
		if ev.Type == api.EventExit {
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				return 0, fmt.Errorf("exec %v: exit %+v", argv, ev)
			}
			return time.Since(start), nil
		}
	}
}

// The parts of a gVisor create, as the backend logs them for every create
// ("sandbox created" ... bundle=… runsc_run=… guest=…): read back from the
// daemon's log for the sandboxes of the create→first exec measurement.
const (
	keyGvCreateRunsc = "agentbox-gvisor-create-runsc"
	keyGvCreateGuest = "agentbox-gvisor-create-guest"
)

// measureGvisorCreateParts reads the parts of the creates of ids (the
// timed ones) from the daemon log at logPath.
func measureGvisorCreateParts(logPath string, ids map[string]bool) []result {
	const (
		runName   = "of which the gvisor backend's runsc run --detach (sandbox, gofer and sentry started, guest exec'd)"
		guestName = "of which the guest's start in the sentry until its socket answers, and the socket's claim"
		note      = "from the backend's \"sandbox created\" log line of each timed create"
	)
	raw, err := os.ReadFile(logPath)
	if err != nil {
		return []result{skipped(keyGvCreateRunsc, groupGvisor, runName, err.Error()), skipped(keyGvCreateGuest, groupGvisor, guestName, err.Error())}
	}
	var runs, guests []time.Duration
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, `msg="sandbox created"`) || !strings.Contains(line, "backend=gvisor") {
			continue
		}
		f := logFields(line)
		if !ids[f["sandbox"]] {
			continue
		}
		r, err1 := time.ParseDuration(f["runsc_run"])
		g, err2 := time.ParseDuration(f["guest"])
		if err1 != nil || err2 != nil {
			continue
		}
		runs, guests = append(runs, r), append(guests, g)
	}
	var noLines error
	if len(runs) == 0 {
		noLines = fmt.Errorf("no \"sandbox created\" line with runsc_run and guest for the timed sandboxes in %s", logPath)
	}
	return []result{
		measured(keyGvCreateRunsc, groupGvisor, runName, note, runs, noLines),
		measured(keyGvCreateGuest, groupGvisor, guestName, note, guests, noLines),
	}
}

// logFields splits a slog text line into its key=value fields (values
// without spaces, which is all measureGvisorCreateParts reads).
func logFields(line string) map[string]string {
	out := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			out[k] = v
		}
	}
	return out
}

// gvisorBoundsText says what bounds the gVisor figures, by the rows above
// that measure each part in the same run (it is prose: it holds whatever a
// run measures; docs/GVISOR.md has the analysis).
const gvisorBoundsText = `
## What bounds the gVisor figures

- **Exec round trip (target ≤ 3 ms).** Its parts are measured in the same
  run: the guest's version call on the sandbox's socket is the transport
  alone (a fresh connection through the sentry's --host-uds socket, one
  request, one reply: under a millisecond, a few times native's); exec
  /bin/true straight on the socket is the round trip without the daemon;
  the sentry's fork+exec+wait of /bin/true, timed from inside by a shell
  loop, is what gVisor charges for a process, whoever starts it. The guest
  starts a process with Go's clone(CLONE_VM|CLONE_VFORK) and execve, which
  the sentry serves in about the time the shell's fork+exec takes: the
  round trip is that spawn plus about a millisecond of transport and two
  of daemon and HTTP (as under native). The spawn is the sentry's: a new
  address space and the ELF loaded through the gofer (fork alone, a
  subshell, costs about a third of it). No runsc flag moves it (systrap's
  fast paths switch themselves on and off by load; --directfs,
  --overlay2 and --host-uds make no difference measurable here), so
  3 ms is out of reach for an exec that starts a process in the sentry.
  What was ours is gone: every exec used to run ` + "`runsc events --stats`" + `
  one to three times (the OOM count sampled around it, the run record's
  CPU time; 70+ ms each): the core now reads those counters from the host
  cgroup (runtime.CounterReader). The rows are noisy on a loaded machine:
  the exec on the socket may come out above the exec through the daemon,
  which contains it.
- **Create → first exec (target ≤ 1/3 of runsc run).** The backend logs
  the parts of every create and the bench reads them back: runsc run
  --detach (runsc create and start: the sandbox and gofer processes, the
  sentry's boot, the container's cgroups with their limits, the guest
  exec'd) is most of it and is runsc's own; the guest's start in the
  sentry (a 40 MB Go binary: its page faults through the sentry and about
  280 package initialisers, of which github.com/santhosh-tekuri/jsonschema/v6
  compiling every JSON Schema metaschema is the largest) until its socket
  answers is the next part; then the first exec (the first spawn in a
  fresh sentry, colder than the exec round trip) and the daemon's own few
  milliseconds. Nothing of the create's own could run beside runsc run
  (the bundle takes about a millisecond). The wait for the guest polls
  with a back-off of up to 20 ms: a faster poll would take about 5 ms
  off; it is left out until the memory checkpoint path's race (its test
  fails now and then with or without it; docs/GVISOR.md) is understood.
  runsc run of
  true, the peer, starts the same sandbox without cgroups, user namespace
  or mounts, and needs no agent: a third of it is below runsc's own boot,
  so the target is reachable only with sandboxes started ahead of the
  request (a warm pool of gVisor sandboxes) or a memory restore of a
  booted one.
- **Memory checkpoint, restore, fork ×10.** A memory checkpoint is the
  guest's quiesce (one round trip), runsc pause, the upper dir's copy,
  runsc checkpoint --leave-running (writing the sentry's memory: at least
  the 50 MB of this process, uncompressed), runsc resume and the
  reconnect (the guest rebinds, polled every 2 ms, then two authenticated
  round trips). A restore is runsc restore (most of it runsc starting a
  sandbox and loading the image) plus the same reconnect. Fork ×10 runs
  four restores at a time on two cores: bounded by about 10/4 restores
  plus their contention for the CPU.
`
