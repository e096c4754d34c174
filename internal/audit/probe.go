package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// probeOverlay checks, on a real overlay whose upper dir is on the
// tracker's filesystem, that the tracker sees what a sandbox does
// through an overlay: it makes one (in a mount namespace of its own, so
// nothing is left mounted if the daemon dies), changes files through it
// (appending to a file already in the upper dir, writing a file of the
// lower layer, which copies it up, creating, renaming, hard linking,
// deleting, changing a mode) and compares the tracker's changes with
// two full walks'. Before Linux 6.6 overlayfs reports a file's data
// writes on its own inode, not the upper dir's, and this fails.
func (t *tracker) probeOverlay() error {
	root, err := os.MkdirTemp(t.dir, "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	errc := make(chan error, 1)
	go func() {
		// The thread ends with the goroutine (never unlocked), and its
		// mount namespace with it.
		runtime.LockOSThread()
		errc <- t.probeIn(root)
	}()
	return <-errc
}

func (t *tracker) probeIn(root string) error {
	lower, upper, work, merged := filepath.Join(root, "lower"), filepath.Join(root, "upper"), filepath.Join(root, "work"), filepath.Join(root, "merged")
	for _, d := range []string{filepath.Join(lower, "ld"), upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for p, s := range map[string]string{filepath.Join(lower, "lf"): "lower", filepath.Join(lower, "ld", "x"): "x", filepath.Join(upper, "uf"): "upper"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return err
		}
	}
	ctx := context.Background()
	if err := t.begin(ctx, upper, true); err != nil {
		return fmt.Errorf("probing overlayfs: %w", err)
	}
	defer t.forget(upper)
	// After begin: mount ids differ in the new namespace.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("probing overlayfs: unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("probing overlayfs: %w", err)
	}
	before := scanUpper(upper, 1000)
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",userxattr"
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("probing overlayfs: mount: %w", err)
	}
	m := func(p string) string { return filepath.Join(merged, p) }
	steps := []func() error{
		func() error {
			f, err := os.OpenFile(m("uf"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteString(" more")
			return joinClose(err, f)
		},
		func() error { return os.WriteFile(m("lf"), []byte("changed"), 0o644) },
		func() error { return os.WriteFile(m("nf"), []byte("new"), 0o644) },
		func() error { return os.Chmod(m("nf"), 0o600) },
		func() error { return os.Rename(m("nf"), m("nf2")) },
		func() error { return os.Mkdir(m("d"), 0o755) },
		func() error { return os.WriteFile(m("d/f"), []byte("f"), 0o644) },
		func() error { return os.Remove(m("ld/x")) },
		func() error { return os.Link(m("nf2"), m("d/hl")) },
	}
	for i, s := range steps {
		if err := s(); err != nil {
			unix.Unmount(merged, unix.MNT_DETACH)
			return fmt.Errorf("probing overlayfs: step %d: %w", i, err)
		}
	}
	if err := unix.Unmount(merged, 0); err != nil {
		return fmt.Errorf("probing overlayfs: unmount: %w", err)
	}
	got, walked, err := t.end(ctx, upper)
	if err != nil {
		return fmt.Errorf("probing overlayfs: %w", err)
	}
	want := diffListings(before, scanUpper(upper, 1000))
	if walked || describeChanges(got) != describeChanges(want) {
		return fmt.Errorf("fanotify does not report overlayfs's changes in its upper dir on this kernel (saw %s, a walk %s; walked %v): %w",
			describeChanges(got), describeChanges(want), walked, errdefs.ErrNotImplemented)
	}
	return nil
}

func joinClose(err error, f *os.File) error {
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// describeChanges renders changes for comparison.
func describeChanges(cs []fileChange) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.change + " " + strconv.Quote(c.rel) + ";")
	}
	return b.String()
}
