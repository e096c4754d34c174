package test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// counterPy holds a 50 MB object and counts in memory, writing the count
// to /tmp/n every 50 ms; SIGUSR1 makes it write the object's digest to
// /tmp/digest-now (the digest at start is in /tmp/digest0).
const counterPy = `
import hashlib, os, signal, time
blob = bytearray(os.urandom(1 << 20)) * 50
def digest():
    return hashlib.sha256(blob).hexdigest()
def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
put("/tmp/digest0", digest())
asked = False
def on_usr1(sig, frame):
    global asked
    asked = True
signal.signal(signal.SIGUSR1, on_usr1)
put("/tmp/pid", str(os.getpid()))
n = 0
while True:
    n += 1
    put("/tmp/n", str(n))
    if asked:
        asked = False
        put("/tmp/digest-now", digest())
    time.sleep(0.05)
`

func readCount(t *testing.T, sb *agentbox.Sandbox) int {
	t.Helper()
	out := strings.TrimSpace(mustRun(t, sb, "cat /tmp/n"))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("%s: /tmp/n = %q", sb.ID(), out)
	}
	return n
}

// blobIntact asks the counter for its object's digest and compares it with
// the one it wrote at start.
func blobIntact(t *testing.T, sb *agentbox.Sandbox) {
	t.Helper()
	got := mustRun(t, sb, `rm -f /tmp/digest-now; kill -USR1 $(cat /tmp/pid); for i in $(seq 100); do [ -s /tmp/digest-now ] && break; sleep 0.1; done; cat /tmp/digest0; echo; cat /tmp/digest-now`)
	f := strings.Fields(got)
	if len(f) != 2 || f[0] != f[1] || len(f[0]) != 64 {
		t.Errorf("%s: the 50 MB object's digest at start and now: %q", sb.ID(), got)
	}
}

// TestGvisorMemoryCheckpoint: a python3 process holding a 50 MB object
// and a counter survives a memory checkpoint (the source counts on), a
// restore in place (the process is back at the checkpointed count, the
// sandbox answers exec at once) and a fork ×3 (each fork counts on from
// the checkpointed value, independently of the others), the object
// intact everywhere.
func TestGvisorMemoryCheckpoint(t *testing.T) {
	testutil.Short(t)
	requiresRunsc(t)
	testutil.RequiresBinary(t, "mmdebstrap")
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := d.client.BuildTemplate(ctx, api.BuildTemplateRequest{Name: "debian"}, nil); err != nil {
		t.Fatalf("building the debian template: %v", err)
	}
	sb := d.create(t, agentbox.SandboxSpec{Template: "debian", Runtime: "gvisor"})
	if err := sb.WriteFile(ctx, "/root/counter.py", []byte(counterPy), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, api.ExecRequest{Command: "python3 /root/counter.py"}); err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "for i in $(seq 300); do [ -s /tmp/n ] && break; sleep 0.1; done; cat /tmp/n")
	time.Sleep(300 * time.Millisecond)

	before := readCount(t, sb)
	ck, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Name: "mem", Memory: true})
	if err != nil {
		t.Fatalf("memory checkpoint: %v", err)
	}
	if !ck.Memory {
		t.Errorf("checkpoint %+v: not a memory checkpoint", ck)
	}
	t.Logf("memory checkpoint: frozen %d ms", ck.DurationMS)
	// The source runs on, its guest reconnected.
	after := readCount(t, sb)
	if after < before {
		t.Errorf("source after the checkpoint counts %d, before it %d", after, before)
	}
	time.Sleep(time.Second)
	later := readCount(t, sb)
	if later <= after+5 {
		t.Errorf("the source stopped counting after the checkpoint: %d then %d", after, later)
	}

	// Restore in place: the process is back where it was checkpointed.
	rr, err := sb.Restore(ctx, ck.ID)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore from memory: %d ms", rr.DurationMS)
	restored := readCount(t, sb) // the first call after the restore
	if restored < before || restored >= later {
		t.Errorf("after restore the counter is at %d; checkpointed after %d, was at %d before the restore", restored, before, later)
	}
	blobIntact(t, sb)

	// Three forks, each counting on from the checkpoint on its own.
	forkStart := time.Now()
	forks, err := d.client.Fork(ctx, ck.ID, 3)
	t.Logf("fork ×3 from memory: %v", time.Since(forkStart))
	if err != nil {
		t.Fatalf("fork ×3: %v", err)
	}
	for _, fk := range forks {
		t.Cleanup(func() { _ = fk.Delete(context.WithoutCancel(ctx)) })
		if fk.Info().Backend != "gvisor" {
			t.Errorf("fork %s runs on %q", fk.ID(), fk.Info().Backend)
		}
		// A fork counts on from the checkpointed value as soon as it
		// runs, the others being made meanwhile: at most one count per
		// 50 ms since the fork call began (plus slack) past the
		// checkpoint, never below it, never from 0.
		n := readCount(t, fk)
		if most := before + int(time.Since(forkStart)/(50*time.Millisecond)) + 10; n < before || n > most {
			t.Errorf("fork %s is at %d: checkpointed after %d, so between %d and %d", fk.ID(), n, before, before, most)
		}
	}
	// Stop the first fork's counter: the others go on.
	mustRun(t, forks[0], "kill -STOP $(cat /tmp/pid)")
	stopped := readCount(t, forks[0])
	start := map[string]int{}
	for _, fk := range forks[1:] {
		start[fk.ID()] = readCount(t, fk)
	}
	time.Sleep(time.Second)
	if n := readCount(t, forks[0]); n != stopped {
		t.Errorf("the stopped fork's counter moved: %d then %d", stopped, n)
	}
	for _, fk := range forks[1:] {
		if n := readCount(t, fk); n <= start[fk.ID()] {
			t.Errorf("fork %s stopped counting with the first: %d then %d", fk.ID(), start[fk.ID()], n)
		}
		blobIntact(t, fk)
	}

	// Deleting the checkpoint (once nothing runs on it) deletes its image.
	for _, fk := range forks {
		if err := fk.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteCheckpoint(ctx, ck.ID); err != nil {
		t.Fatalf("delete checkpoint: %v", err)
	}
	if left := d.memoryImages(t); len(left) > 0 {
		t.Errorf("memory images left after the checkpoint's deletion: %v", left)
	}
}

// TestGvisorMemoryCheckpointSecrets: a memory checkpoint is refused while
// a process started with a secret runs (its memory holds it), unless the
// caller allows it; once that process is gone it is still refused (the
// guest that started it may hold it), until a restore from a filesystem
// checkpoint gives the sandbox a fresh guest.
func TestGvisorMemoryCheckpointSecrets(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	ctx := context.Background()
	if _, err := d.client.SetSecret(ctx, "api", []byte("s3cr3t-value")); err != nil {
		t.Fatal(err)
	}
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	holder, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 120", Secrets: []api.ExecSecret{{Name: "api", Env: "K"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Memory: true})
	if !agentbox.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "allow_secrets_in_memory") {
		t.Fatalf("memory checkpoint with a secret holder running: %v; want failed_precondition naming allow_secrets_in_memory", err)
	}
	// A filesystem checkpoint holds no memory: it is taken.
	files, err := sb.Checkpoint(ctx, "files")
	if err != nil {
		t.Fatalf("filesystem checkpoint: %v", err)
	}
	if ck, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Memory: true, AllowSecretsInMemory: true}); err != nil || !ck.Memory {
		t.Errorf("memory checkpoint allowed to hold secrets: %+v, %v", ck, err)
	}
	if err := holder.Signal(ctx, "KILL"); err != nil {
		t.Fatal(err)
	}
	// Once the holder is gone its secret may still be in the guest's
	// memory (it was given it to start the holder): still refused.
	for i := 0; i < 50; i++ {
		_, err = sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Memory: true})
		if !agentbox.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "still runs") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !agentbox.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "since it started") {
		t.Errorf("memory checkpoint once the secret holder is gone, its guest the same: %v; want failed_precondition: the guest handled secrets", err)
	}
	// A restore from the filesystem checkpoint starts a fresh guest,
	// which never saw the secret: taken.
	if _, err := sb.Restore(ctx, files.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Memory: true}); err != nil {
		t.Errorf("memory checkpoint with a fresh guest: %v", err)
	}
	// Native has no memory checkpoints: a clear error.
	nat := d.create(t, agentbox.SandboxSpec{})
	if _, err := nat.CheckpointWith(ctx, agentbox.CheckpointOptions{Memory: true}); !agentbox.IsFailedPrecondition(err) {
		t.Errorf("memory checkpoint of a native sandbox: %v; want failed_precondition", err)
	}
}

// memoryImages lists the memory images in d's data dir.
func (d *daemon) memoryImages(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.dataDir, "memory"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// identityCmd prints a sandbox's identity, one item a line: its hostname
// as hostname(1), the kernel and uname -n see it, its machine-id and the
// digest of its random seed.
const identityCmd = "hostname; cat /proc/sys/kernel/hostname; uname -n; cat /etc/machine-id; sha256sum < /var/lib/systemd/random-seed | cut -d' ' -f1; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo"

// sandboxIdentity is what identityCmd printed; urandom is 16 bytes the
// kernel's random source gave, not part of the identity but of what must
// not repeat across forks.
type sandboxIdentity struct{ hostnames, machineID, seed, urandom string }

func identityOf(t *testing.T, sb *agentbox.Sandbox) sandboxIdentity {
	t.Helper()
	l := strings.Split(strings.TrimSpace(mustRun(t, sb, identityCmd)), "\n")
	if len(l) != 6 || l[0] != l[1] || l[0] != l[2] || len(l[3]) != 32 || len(l[4]) != 64 || len(l[5]) != 32 {
		t.Fatalf("%s: identity %q: want one hostname three times, a machine-id, a seed digest and 16 random bytes", sb.ID(), l)
	}
	return sandboxIdentity{hostnames: l[0], machineID: l[3], seed: l[4], urandom: l[5]}
}

// TestGvisorMemoryForkIdentity: each of three forks of a memory
// checkpoint continues from the source's memory with an identity of its
// own: its hostname (its id, by every name: the source's is in the
// image's kernel state), machine-id and random seed, none the source's or
// another fork's, although the source had read its own into the sentry's
// caches before the checkpoint and a process of it holds its machine-id
// open. The source keeps its own, and a restore in place keeps the
// sandbox's own hostname.
func TestGvisorMemoryForkIdentity(t *testing.T) {
	requiresRunsc(t)
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb := d.create(t, agentbox.SandboxSpec{Runtime: "gvisor"})
	mustRun(t, sb, "mkdir -p /var/lib/systemd && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /etc/machine-id && echo >> /etc/machine-id && head -c 512 /dev/urandom > /var/lib/systemd/random-seed")
	src := identityOf(t, sb)
	if src.hostnames != sb.ID() {
		t.Fatalf("source's hostname %q, want its id %s", src.hostnames, sb.ID())
	}
	if _, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 600 < /etc/machine-id"}); err != nil {
		t.Fatal(err)
	}
	ck, err := sb.CheckpointWith(ctx, agentbox.CheckpointOptions{Name: "mem", Memory: true})
	if err != nil {
		t.Fatalf("memory checkpoint: %v\nguest log: %s", err, d.guestLog(sb.ID()))
	}
	forks, err := d.client.Fork(ctx, ck.ID, 3)
	if err != nil {
		t.Fatalf("fork ×3: %v", err)
	}
	seen := map[string]string{src.hostnames: sb.ID(), src.machineID: sb.ID(), src.seed: sb.ID(), src.urandom: sb.ID()}
	for _, fk := range forks {
		t.Cleanup(func() { _ = fk.Delete(context.WithoutCancel(ctx)) })
		// It continues from the source's memory: the sleep runs on.
		if out := mustRun(t, fk, "ps -o args | grep -q '^[s]leep 600' && echo running"); strings.TrimSpace(out) != "running" {
			t.Errorf("fork %s: the source's process is not there: %q", fk.ID(), out)
		}
		id := identityOf(t, fk)
		if id.hostnames != fk.ID() {
			t.Errorf("fork %s calls itself %q", fk.ID(), id.hostnames)
		}
		for what, v := range map[string]string{"hostname": id.hostnames, "machine-id": id.machineID, "random seed": id.seed, "/dev/urandom output": id.urandom} {
			if other, dup := seen[v]; dup {
				t.Errorf("fork %s has the %s of %s (%s)", fk.ID(), what, other, v)
			}
			seen[v] = fk.ID()
		}
	}
	if got := identityOf(t, sb); got.hostnames != src.hostnames || got.machineID != src.machineID || got.seed != src.seed {
		t.Errorf("the source's identity changed with its forks: %+v, was %+v", got, src)
	}
	// A restore in place resumes the image under the sandbox's own name.
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got := identityOf(t, sb); got.hostnames != sb.ID() {
		t.Errorf("after a restore in place the sandbox calls itself %q, want %s", got.hostnames, sb.ID())
	}
}

// guestLog is what the guest of sandbox id (and runsc) logged, while the
// sandbox exists.
func (d *daemon) guestLog(id string) string {
	b, err := os.ReadFile(filepath.Join(d.dataDir, "sandboxes", id, "state", "guest.log"))
	if err != nil {
		return err.Error()
	}
	return string(b)
}
