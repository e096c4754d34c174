package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// rebindAttackSrc is a static program uploaded into a gVisor sandbox to
// attack the window of a memory checkpoint in which the guest's socket
// directory (dir, the guest's /dev/.agentbox-run) is open to the sandbox
// for the guest to bind its sockets again. It runs as the sandbox's root
// for the given duration and logs to /tmp/attack.log:
//
//   - "SERVED <name> <bytes>": a connection of its own to a socket of that
//     name got something from whatever listened (the guest must serve no
//     connection from inside: a challenge of its could be relayed to the
//     host from an impostor socket);
//   - "HOST-SAID <name> <line>": what the host sent one of its impostor
//     sockets (all the host may send to a socket it has not verified is a
//     proof and a challenge of its own: never a command, never a request);
//   - "BOUND <name>", "LINKED <name>", "MKDIR <name>": a squat that took.
//
// It squats both names in a tight loop with its own listening sockets,
// symlinks to victim (a host path: the host must never chmod or chown
// through one), directories and files, removing whatever is there
// (the guest's sockets too), and floods both names with connections that
// try the control commands with a made-up proof; with a fourth argument
// "flood" it only floods. With "once" instead of a duration it tries each
// thing once and prints what happened.
const rebindAttackSrc = `package main

import (
	"bufio"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

var (
	mu  sync.Mutex
	log *os.File
)

func logf(format string, a ...any) {
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(log, format+"\n", a...)
}

var names = []string{"guest.sock", "ctl.sock"}

// fake is the made-up proof of its probes; its impostors' challenges
// start with mark. Neither is ever a MAC of the host's.
var (
	fake = strings.Repeat("a", 64)
	mark = strings.Repeat("f", 16)
)

// probe connects to path, reports whatever it is sent and tries the
// control socket's commands with a made-up proof.
func probe(name, path string) (string, bool) {
	c, err := net.DialTimeout("unix", path, 50*time.Millisecond)
	if err != nil {
		return "dial: " + err.Error(), false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	fmt.Fprintf(c, "%s hostname pwned\n%s quiesce x\n%s prove %s\n", fake, fake, fake, fake)
	b := make([]byte, 256)
	n, _ := c.Read(b)
	if n > 0 && !strings.HasPrefix(string(b[:n]), mark) { // not one of its own
		logf("SERVED %s %q", name, b[:n])
		return fmt.Sprintf("served %q", b[:n]), true
	}
	return "connected, nothing served", false
}

func impostor(name string, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s%048x\n", mark, rand.Uint64())
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if line != "" && !strings.HasPrefix(line, fake) { // not its own probe
					logf("HOST-SAID %s %q", name, line)
				}
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s%048x\n", mark, rand.Uint64())
			}
		}()
	}
}

func main() {
	dir, victim := os.Args[1], os.Args[2]
	var err error
	log, err = os.OpenFile("/tmp/attack.log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	if os.Args[3] == "once" {
		for _, n := range names {
			p := filepath.Join(dir, n)
			res, _ := probe(n, p)
			fmt.Printf("%s connect: %s\n", n, res)
			if l, err := net.Listen("unix", p); err == nil {
				fmt.Printf("%s bind: BOUND\n", n)
				l.Close()
			} else {
				fmt.Printf("%s bind: %v\n", n, err)
			}
			if err := os.Symlink(victim, p+".l"); err == nil {
				fmt.Printf("%s symlink: LINKED\n", n)
			}
		}
		return
	}
	d, err := time.ParseDuration(os.Args[3])
	if err != nil {
		panic(err)
	}
	end := time.Now().Add(d)
	for _, n := range names {
		go func() {
			for time.Now().Before(end) {
				probe(n, filepath.Join(dir, n))
				time.Sleep(time.Millisecond)
			}
		}()
	}
	if len(os.Args) > 4 && os.Args[4] == "flood" {
		time.Sleep(time.Until(end))
		return
	}
	own := map[string]net.Listener{}
	for time.Now().Before(end) {
		for _, n := range names {
			p := filepath.Join(dir, n)
			if l := own[n]; l != nil && rand.Intn(4) == 0 {
				l.Close()
				delete(own, n)
			}
			switch rand.Intn(5) {
			case 0, 1:
				if own[n] != nil {
					break
				}
				os.Remove(p)
				if l, err := net.Listen("unix", p); err == nil {
					l.(*net.UnixListener).SetUnlinkOnClose(false)
					own[n] = l
					logf("BOUND %s", n)
					go impostor(n, l)
				}
			case 2:
				os.Remove(p)
				if os.Symlink(victim, p) == nil {
					logf("LINKED %s", n)
				}
			case 3:
				os.Remove(p)
				if os.Mkdir(p, 0o755) == nil {
					logf("MKDIR %s", n)
				}
			}
		}
		time.Sleep(time.Duration(rand.Intn(3000)) * time.Microsecond)
	}
}
`

// TestGvisorReconnectWindowAttacks attacks, from inside a gVisor sandbox
// (as its root), the window of every memory checkpoint in which the guest
// closed its sockets to the host and binds them again in a directory the
// host opened to the sandbox for it: squatting both socket names with
// sockets of its own (impostors), symlinks to a host file, directories and
// files, removing the guest's, and flooding both names with connections
// that try the control commands. Outside the window nothing is reachable
// or bindable there. During it:
//
//   - the host never talks to an impostor but to verify it (a proof and a
//     challenge, which it cannot answer): no command, no request, and the
//     guest serves nothing to a connection from inside (so there is no
//     challenge to relay);
//   - the host never follows a planted symlink (the host file's mode and
//     owner are unchanged) and no control command from inside takes
//     effect (the hostname stays the sandbox's);
//   - every checkpoint ends in bounded time, either taken with the guest
//     back (the sandbox answers exec under its own name) or failed with
//     the sandbox reported lost (stopped): never running without a guest,
//     never a hang.
func TestGvisorReconnectWindowAttacks(t *testing.T) {
	requiresRunsc(t)
	dir := t.TempDir()
	bin := buildStatic(t, dir, "rebindattack", rebindAttackSrc)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("host file\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(victim, 1234, 1234); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	if err := sb.WriteFile(ctx, "/usr/local/bin/rebindattack", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	const sockDir = "/dev/.agentbox-run"

	// Outside the window: nothing there to reach, nothing to bind.
	once := mustRun(t, sb, "rebindattack "+sockDir+" "+victim+" once")
	if strings.Contains(once, "served") || strings.Contains(once, "BOUND") || strings.Contains(once, "LINKED") {
		t.Errorf("the socket directory outside a checkpoint:\n%s", once)
	}

	// Flooding alone: every checkpoint is taken, the guest back.
	if taken, lost := attackWindow(t, d, sb, "rebindattack "+sockDir+" "+victim+" 60s flood", false); taken != 3 || lost {
		t.Errorf("under a flood of connections: %d of 3 checkpoints taken, lost %v", taken, lost)
	}
	// Squatting too, in a sandbox of its own.
	sq := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	if err := sq.WriteFile(ctx, "/usr/local/bin/rebindattack", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	attackWindow(t, d, sq, "rebindattack "+sockDir+" "+victim+" 60s", true)
	fi, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o640 || st.Uid != 1234 || st.Gid != 1234 {
		t.Errorf("the host file behind the planted symlinks: mode %v, owner %d:%d; was 0640 1234:1234", fi.Mode(), st.Uid, st.Gid)
	}
}

// attackWindow runs attack in sb in the background, takes up to three
// memory checkpoints of sb under it (stopping when sb is lost), checks
// each outcome and what the attacker logged, and reports how many were
// taken and whether sb was lost. squat says the attacker squats names
// (and must have managed it at least once).
func attackWindow(t *testing.T, d *daemon, sb *agentbox.Sandbox, attack string, squat bool) (taken int, lost bool) {
	t.Helper()
	ctx := context.Background()
	if _, err := sb.Start(ctx, api.ExecRequest{Command: attack}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3 && !lost; i++ {
		cctx, ccancel := context.WithTimeout(ctx, 90*time.Second)
		start := time.Now()
		_, err := sb.CheckpointWith(cctx, agentbox.CheckpointOptions{Name: fmt.Sprintf("mem%d", i), Memory: true})
		ccancel()
		took := time.Since(start)
		t.Logf("memory checkpoint %d under attack: %v after %v", i, err, took)
		if took > 75*time.Second {
			t.Errorf("checkpoint %d took %v", i, took)
		}
		if err := sb.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		switch st := sb.Info().State; {
		case st == api.StateRunning:
			// The guest is back: it answers, under its own name.
			if err != nil {
				t.Errorf("checkpoint %d failed (%v) but the sandbox runs on", i, err)
			}
			taken++
			if out := mustRun(t, sb, "hostname"); strings.TrimSpace(out) != sb.ID() {
				t.Errorf("hostname after checkpoint %d: %q", i, out)
			}
		case err != nil && st == api.StateStopped:
			lost = true
		default:
			t.Fatalf("after checkpoint %d (%v) the sandbox is %s", i, err, st)
		}
	}
	t.Logf("%d checkpoints taken, sandbox lost: %v", taken, lost)

	// What the attacker saw (its log is in the sandbox's writable layer).
	raw, err := os.ReadFile(filepath.Join(d.upperOf(sb.ID()), "tmp", "attack.log"))
	if err != nil {
		t.Fatalf("the attacker's log: %v", err)
	}
	proofLine := regexp.MustCompile(`^HOST-SAID (guest|ctl)\.sock "[0-9a-f]{64} prove [0-9a-f]{64}\\n"$`)
	counts := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue
		}
		kind, _, _ := strings.Cut(l, " ")
		counts[kind]++
		switch kind {
		case "SERVED":
			t.Errorf("the guest served a connection from inside: %s", l)
		case "HOST-SAID":
			if !proofLine.MatchString(l) {
				t.Errorf("the host talked to an impostor: %s", l)
			}
		}
	}
	t.Logf("attacker: %v", counts)
	if squat && counts["BOUND"] == 0 {
		t.Errorf("the attacker never squatted a socket name: the window was not attacked (%v)", counts)
	}
	return taken, lost
}
