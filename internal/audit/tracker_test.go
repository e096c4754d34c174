package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// startTestTracker starts a tracker (no overlay probe) on the filesystem
// of the test's temp dir and returns it with a fresh upper dir there.
func startTestTracker(t *testing.T, limit int) (*tracker, string) {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	trk, err := startTracker(filepath.Join(dir, "track"), limit, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("starting the change tracker: %v", err)
	}
	t.Cleanup(trk.close)
	upper := filepath.Join(dir, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	return trk, upper
}

// sh runs script in dir.
func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// trackedRun runs script in upper as one tracked run and checks that
// the tracker's changes are a full walk's, without falling back.
func trackedRun(t *testing.T, trk *tracker, upper, script string) []fileChange {
	t.Helper()
	ctx := context.Background()
	if err := trk.begin(ctx, upper, false); err != nil {
		t.Fatal(err)
	}
	before := scanUpper(upper, 1<<20)
	sh(t, upper, script)
	got, walked, err := trk.end(ctx, upper)
	if err != nil {
		t.Fatal(err)
	}
	want := diffListings(before, scanUpper(upper, 1<<20))
	if walked {
		t.Fatalf("%s: the tracker fell back to a walk", script)
	}
	if describeChanges(got) != describeChanges(want) {
		t.Fatalf("%s:\ntracker: %s\nwalk:    %s", script, describeChanges(got), describeChanges(want))
	}
	return got
}

// The tracker's changes are a full walk's for what a sandbox can do to
// its layer, including what tries to hide a change from an event-driven
// view: renames of directories (their entries never get events of their
// own), rename storms ending where they started, hard links (a change
// through one name changes the others; a link made and removed within a
// run changes the first name's ctime with an event naming no path),
// creating and deleting within a run, a directory replaced by a file,
// writes through a shared mapping, changes in a directory moved by an
// earlier run (its cached location is stale). One tracker, one layer,
// run after run.
func TestTrackerMatchesWalk(t *testing.T) {
	trk, upper := startTestTracker(t, 1<<20)
	sh(t, upper, "mkdir -p a/b/c d; echo 1 > a/b/c/f; echo 2 > d/g; echo 3 > top; ln top d/hard")
	for _, script := range []string{
		"echo new > n1; echo more >> top; rm d/g",
		"mv a z",                               // a directory and everything below it moves
		"echo x > z/b/c/f2; echo y >> z/b/c/f", // in the moved directory, by its new path
		"mv z a; mv a/b a/b2; mv a/b2 a/b",     // a rename storm back to the start
		"mv a z; echo x > z/b/c/new; mv z a",   // changed while elsewhere
		"for i in 1 2 3 4 5 6 7 8 9 10; do mv top top.$i; mv top.$i top; done",
		"echo via-link >> d/hard",                                       // changes top too
		"ln top tmp-link; rm tmp-link",                                  // top's ctime only
		"echo gone > tmp; rm tmp; mkdir tmpd; touch tmpd/x; rm -r tmpd", // nothing left
		"rm -r a/b; echo file > a/b",                                    // a directory replaced by a file
		"chmod 600 n1; truncate -s 0 d/hard",
		"ln -s /etc/passwd link; mkfifo fifo; mkdir -p deep/er/est; mv deep d/",
		"rm -rf d; mkdir d; echo back > d/g", // a directory deleted and made again
		"python3 -c \"import mmap;f=open('n1','r+b');f.truncate(4096);m=mmap.mmap(f.fileno(),4096);m[0:4]=b'mmap';m.flush();m.close();f.close()\"",
	} {
		if strings.HasPrefix(script, "python3") {
			if _, err := exec.LookPath("python3"); err != nil {
				script = "printf mmap > n1"
			}
		}
		trackedRun(t, trk, upper, script)
	}
}

// Changes made between runs (by a background process) are reported by
// the next run when begin does not absorb them, and not when it does.
func TestTrackerBetweenRuns(t *testing.T) {
	trk, upper := startTestTracker(t, 1<<20)
	ctx := context.Background()
	trackedRun(t, trk, upper, "echo 1 > f")
	sh(t, upper, "echo between > b1")
	if err := trk.begin(ctx, upper, false); err != nil {
		t.Fatal(err)
	}
	sh(t, upper, "echo run > r1")
	if got, _, err := trk.end(ctx, upper); err != nil || describeChanges(got) != `created "b1";created "r1";` {
		t.Fatalf("carried over: %s %v", describeChanges(got), err)
	}
	sh(t, upper, "echo between > b2")
	if err := trk.begin(ctx, upper, true); err != nil {
		t.Fatal(err)
	}
	sh(t, upper, "echo run > r2")
	got, _, err := trk.end(ctx, upper)
	if err != nil || describeChanges(got) != `created "r2";` {
		t.Fatalf("absorbed: %s %v", describeChanges(got), err)
	}
}

// A layer of 30,000 files (past the 20,000 entries a walk lists) still
// records a change to a file deep in it, and only that change.
func TestTrackerDeepChangeInBigLayer(t *testing.T) {
	trk, upper := startTestTracker(t, defaultScanLimits.Tracked)
	for i := range 30 {
		d := filepath.Join(upper, fmt.Sprintf("d%02d", i), "x", "y")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 1000 {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", j)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !scanUpper(upper, defaultScanLimits.Entries).truncated {
		t.Fatal("a walk of 30,000 files is not truncated: the test shows nothing")
	}
	ctx := context.Background()
	if err := trk.begin(ctx, upper, true); err != nil {
		t.Fatal(err)
	}
	deep := filepath.Join(upper, "d29", "x", "y", "f0999")
	if err := os.WriteFile(deep, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, walked, err := trk.end(ctx, upper)
	if err != nil || walked {
		t.Fatalf("end: walked %v, %v", walked, err)
	}
	if s := describeChanges(got); s != `modified "d29/x/y/f0999";` {
		t.Fatalf("changes: %s", s)
	}
}

// A layer past the tracker's limit is not tracked: its runs walk.
func TestTrackerTooBig(t *testing.T) {
	trk, upper := startTestTracker(t, 10)
	sh(t, upper, "for i in $(seq 20); do touch f$i; done")
	if err := trk.begin(context.Background(), upper, true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("begin on a layer past the limit: %v", err)
	}
}

// When the event queue overflows, the run falls back to a full walk
// compared with the baseline: its changes are still all there.
func TestTrackerOverflowFallsBack(t *testing.T) {
	trk, upper := startTestTracker(t, 1<<20)
	ctx := context.Background()
	if err := trk.begin(ctx, upper, true); err != nil {
		t.Fatal(err)
	}
	before := scanUpper(upper, 1<<20)
	// The reader is stopped (it needs mu) while more events than the
	// queue holds (16,384 by default) are made.
	trk.mu.Lock()
	for i := range 20_000 {
		if err := os.WriteFile(filepath.Join(upper, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			trk.mu.Unlock()
			t.Fatal(err)
		}
	}
	trk.mu.Unlock()
	got, walked, err := trk.end(ctx, upper)
	if err != nil {
		t.Fatal(err)
	}
	if !walked {
		t.Fatal("no fallback after an overflow")
	}
	want := diffListings(before, scanUpper(upper, 1<<20))
	if len(got) != 20_000 || describeChanges(got) != describeChanges(want) {
		t.Fatalf("after the overflow: %d changes, want %d", len(got), len(want))
	}
	// And it tracks again.
	trackedRun(t, trk, upper, "echo x > after")
}

// On a kernel that reports overlayfs's writes on its upper dir (6.6 and
// later: backing files), the probe passes and a tracker starts; before
// that, it must refuse (the recorder then walks).
func TestTrackerOverlayProbe(t *testing.T) {
	testutil.RequiresRoot(t)
	trk, err := newTracker(filepath.Join(t.TempDir(), "track"), 1<<20, slog.New(slog.DiscardHandler))
	if trk != nil {
		trk.close()
	}
	if kernelAtLeast(6, 6) && err != nil {
		t.Fatalf("the overlay probe fails on %s: %v", kernelRelease(), err)
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("the overlay probe: %v", err)
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

func kernelAtLeast(major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(kernelRelease(), "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || (a == major && b >= minor)
}

// FuzzDecodeEvents: whatever the buffer read from the fanotify group
// holds, decoding it never panics nor reads past it (a malformed event
// marks the trees as having lost events).
func FuzzDecodeEvents(f *testing.F) {
	ev := make([]byte, 24)
	ev[0], ev[4], ev[6] = 24, 3, 24
	f.Add(ev)
	withInfo := append(append([]byte{}, ev...), 2, 0, 28, 0, 1, 2, 3, 4, 5, 6, 7, 8, 4, 0, 0, 0, 1, 0, 0, 0, 9, 9, 9, 9, 'a', 0, 0, 0)
	withInfo[0] = byte(len(withInfo))
	f.Add(withInfo)
	f.Fuzz(func(t *testing.T, b []byte) {
		trk := &tracker{log: slog.New(slog.DiscardHandler), trees: map[string]*tree{"/u": newTree("/u")},
			dirs: map[string]dirRef{}, notOurs: map[string]struct{}{}, waiters: map[string]chan struct{}{}}
		trk.decodeLocked(b)
	})
}
