package guest_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
)

// Special files are refused quickly with an invalid argument, for reads
// and writes; nothing special is replaced.
func TestSpecialFilesRefused(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	must(t, syscall.Mkfifo(fifo, 0o600))
	must(t, os.Symlink(fifo, filepath.Join(dir, "tofifo")))
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	must(t, err)
	defer ln.Close()
	for _, p := range []string{fifo, filepath.Join(dir, "tofifo"), sock, dir, "/dev/null", "/dev/zero", "/dev/tty", "/proc/self/status", "/proc/self/mem", "/sys/kernel/uevent_seqnum",
		"/proc/self/exe", "/proc/self/root/etc/passwd", "/proc/self/cwd/special_test.go"} {
		start := time.Now()
		rc, _, err := c.ReadFile(ctx, p)
		if err == nil {
			rc.Close()
		}
		if !errdefs.IsInvalidArgument(err) || time.Since(start) > 2*time.Second {
			t.Errorf("read %s: %v after %s; want a quick invalid argument", p, err, time.Since(start))
		}
	}
	for _, p := range []string{fifo, sock, dir, "/dev/null", "/proc/self/comm"} {
		if _, err := c.WriteFile(ctx, p, 0, false, bytes.NewReader([]byte("x"))); !errdefs.IsInvalidArgument(err) {
			t.Errorf("write %s: %v; want invalid argument", p, err)
		}
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the FIFO was replaced: %v %v", fi.Mode(), err)
	}
	if _, err := c.ReadArchive(ctx, "/proc/self"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("archive of /proc/self: %v", err)
	}
	// A directory holding a FIFO and a socket archives without blocking.
	rc, err := c.ReadArchive(ctx, dir)
	must(t, err)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "sock" {
			t.Errorf("socket archived")
		}
	}
}

// Every hostile or unsupported tar form is refused with the right
// category and leaves no file behind; a truncated entry leaves no partial
// file.
func TestExtractRules(t *testing.T) {
	c, _ := startGuest(t, guest.Options{})
	ctx := tctx(t)
	one := func(e rawtar.Entry) []byte { var b rawtar.Builder; return b.Add(e).Bytes() }
	// The table shared with the layer and image imports: sparse forms,
	// devices, unknown types, a truncated entry, one declaring a petabyte.
	for _, tc := range rawtar.Rules() {
		if tc.Upload == nil {
			continue
		}
		dst := filepath.Join(t.TempDir(), "dst")
		err := c.WriteArchive(ctx, dst, bytes.NewReader(tc.Tar))
		if !errors.Is(err, tc.Upload) {
			t.Errorf("%s: %v", tc.Name, err)
		}
		if entries, _ := os.ReadDir(dst); len(entries) != 0 {
			t.Errorf("%s: left %d entries, first %s", tc.Name, len(entries), entries[0].Name())
		}
	}
	// An entry below a pseudo filesystem mounted inside the target is
	// refused: nothing is written into /proc.
	if err := c.WriteArchive(ctx, "/", bytes.NewReader(one(rawtar.Entry{Name: "proc/sys/agentbox-test", Mode: 0o644, Typeflag: '0'}))); !errdefs.IsInvalidArgument(err) {
		t.Errorf("entry into /proc: %v", err)
	}
	// Accepted: a global header is ignored, a contiguous file is a file, a
	// FIFO entry is a FIFO, and a regular file replaces what was there
	// atomically.
	var b rawtar.Builder
	b.Add(rawtar.Entry{Name: "g", Typeflag: tar.TypeXGlobalHeader, Size: 0})
	b.Add(rawtar.Entry{Name: "c", Mode: 0o600, Size: 2, Typeflag: tar.TypeCont, Data: []byte("hi")})
	b.Add(rawtar.Entry{Name: "p", Mode: 0o600, Typeflag: tar.TypeFifo})
	dst := filepath.Join(t.TempDir(), "dst")
	must(t, os.MkdirAll(dst, 0o755))
	must(t, os.WriteFile(dst+"/c", []byte("old"), 0o644))
	must(t, c.WriteArchive(ctx, dst, bytes.NewReader(b.Bytes())))
	if got, err := os.ReadFile(dst + "/c"); err != nil || string(got) != "hi" {
		t.Errorf("contiguous file: %q %v", got, err)
	}
	if fi, err := os.Lstat(dst + "/p"); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo entry: %v %v", fi, err)
	}
	if entries, _ := os.ReadDir(dst); len(entries) != 2 {
		t.Errorf("dst holds %d entries, want c and p", len(entries))
	}
}
