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
	data := bytes.Repeat([]byte("A"), 4096)
	one := func(e rawtar.Entry) []byte { var b rawtar.Builder; return b.Add(e).Bytes() }
	truncated := one(rawtar.Entry{Name: "f", Mode: 0o644, Size: 1 << 20, Typeflag: '0', Data: data})
	truncated = truncated[:rawtar.Block+len(data)]
	for _, tc := range []struct {
		name string
		tar  []byte
		is   func(error) bool
	}{
		{"pax-sparse-1.0", rawtar.PAXSparse1("f", 2<<30, data), errdefs.IsInvalidArgument},
		{"pax-sparse-0.1", rawtar.PAXSparse0("f", 2<<30, data), errdefs.IsInvalidArgument},
		{"old-gnu-sparse", rawtar.OldGNUSparse("f", 1<<20, data), errdefs.IsInvalidArgument},
		{"char-device", one(rawtar.Entry{Name: "f", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), errdefs.IsInvalidArgument},
		{"block-device", one(rawtar.Entry{Name: "f", Typeflag: tar.TypeBlock, Devmajor: 7}), errdefs.IsInvalidArgument},
		{"dumpdir", one(rawtar.Entry{Name: "f", Typeflag: 'D'}), errdefs.IsInvalidArgument},
		{"unknown", one(rawtar.Entry{Name: "f", Typeflag: 'Z'}), errdefs.IsInvalidArgument},
		{"truncated", truncated, errdefs.IsInvalidArgument},
		{"declares-a-petabyte", one(rawtar.Entry{Name: "f", Mode: 0o644, Size: 1 << 50, Typeflag: '0', Data: data}),
			func(err error) bool { return errors.Is(err, errdefs.ErrResourceExhausted) }},
	} {
		dst := filepath.Join(t.TempDir(), "dst")
		err := c.WriteArchive(ctx, dst, bytes.NewReader(tc.tar))
		if !tc.is(err) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if entries, _ := os.ReadDir(dst); len(entries) != 0 {
			t.Errorf("%s: left %d entries, first %s", tc.name, len(entries), entries[0].Name())
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
