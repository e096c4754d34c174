package test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/testutil/rawtar"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// unixHTTP is an HTTP client on the daemon's socket whose requests end
// after timeout.
func (d *daemon) unixHTTP(timeout time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "unix", d.socket)
		},
	}, Timeout: timeout}
}

// quickRequest sends a request that must be answered within limit; it
// returns the status and body, or fails the test naming the request.
func (d *daemon) quickRequest(t *testing.T, method, path string, body []byte, limit time.Duration) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://agentbox"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := d.unixHTTP(limit).Do(req)
	if err != nil {
		t.Fatalf("%s %s: no status within %s: %v", method, path, limit, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if el := time.Since(start); el > limit {
		t.Fatalf("%s %s: answered after %s (limit %s)", method, path, el, limit)
	}
	return resp.StatusCode, buf.String()
}

func filesPath(sb *agentbox.Sandbox, p string) string {
	return "/v1/sandboxes/" + sb.ID() + "/files?path=" + url.QueryEscape(p)
}

// guestThreads is the Threads line of the guest (PID 1 of the sandbox).
func guestThreads(t *testing.T, sb *agentbox.Sandbox) int {
	t.Helper()
	out := mustRun(t, sb, "grep Threads /proc/1/status")
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out, "Threads:")))
	if err != nil {
		t.Fatalf("guest threads: %q", out)
	}
	return n
}

// Special files through the files API: a FIFO, a socket, devices, and
// procfs/sysfs files are refused quickly with a 4xx, never a hang or a
// 500, for reads and for writes; a directory too.
func TestAdversarialFilesSpecial(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "mkfifo /tmp/fifo && mkdir -p /tmp/dir && ln -s /tmp/fifo /tmp/tofifo && "+
		"syslogd -O /tmp/syslog && sleep 0.2 && test -S /dev/log")
	for _, p := range []string{
		"/tmp/fifo", "/tmp/tofifo", "/dev/log", "/dev/tty", "/dev/null", "/dev/zero", "/dev/urandom",
		"/proc/self/mem", "/proc/kmsg", "/proc/1/status", "/proc/self/fd/0", "/sys/kernel/uevent_seqnum", "/tmp/dir",
		"/proc/1/exe", "/proc/1/root/etc/passwd",
	} {
		code, body := d.quickRequest(t, "GET", filesPath(sb, p), nil, 3*time.Second)
		if code < 400 || code >= 500 {
			t.Errorf("GET %s: %d %s; want a 4xx", p, code, body)
		}
	}
	for _, p := range []string{"/tmp/fifo", "/dev/log", "/dev/null", "/dev/tty", "/proc/self/comm", "/sys/kernel/uevent_helper", "/tmp/dir"} {
		code, body := d.quickRequest(t, "PUT", filesPath(sb, p), []byte("x"), 3*time.Second)
		if code < 400 || code >= 500 {
			t.Errorf("PUT %s: %d %s; want a 4xx", p, code, body)
		}
	}
	// Nothing was replaced: the FIFO, the socket and the device are still there.
	mustRun(t, sb, "test -p /tmp/fifo && test -S /dev/log && test -c /dev/null")
	// An archive of a pseudo filesystem is refused too; a plain one works.
	if code, body := d.quickRequest(t, "GET", "/v1/sandboxes/"+sb.ID()+"/fs/archive?path=/proc", nil, 3*time.Second); code < 400 || code >= 500 {
		t.Errorf("GET archive of /proc: %d %s; want a 4xx", code, body)
	}
	if code, body := d.quickRequest(t, "GET", "/v1/sandboxes/"+sb.ID()+"/fs/archive?path=/tmp", nil, 3*time.Second); code != 200 {
		t.Errorf("GET archive of /tmp (holding a FIFO): %d %s", code, body)
	}
	// Regular files still read.
	mustRun(t, sb, "echo hello > /tmp/plain")
	if got, err := sb.ReadFile(context.Background(), "/tmp/plain"); err != nil || string(got) != "hello\n" {
		t.Fatalf("plain read: %q, %v", got, err)
	}
}

// guestFDs is the number of descriptors the guest (PID 1) holds.
func guestFDs(t *testing.T, sb *agentbox.Sandbox) int {
	t.Helper()
	out := mustRun(t, sb, "ls /proc/1/fd | wc -l")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("guest fds: %q", out)
	}
	return n
}

// stalledBody sends head, then nothing until ctx ends.
type stalledBody struct {
	ctx  context.Context
	head []byte
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

// Requests abandoned by their clients (cancelled after a moment) leave
// nothing behind in the guest: its thread and descriptor counts return to
// where they were. Thirty reads of a FIFO, ten downloads of a large file
// stopped after the first bytes, ten uploads (file and archive) stalled
// half-way.
func TestAdversarialFilesAbandoned(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, "mkfifo /tmp/fifo && dd if=/dev/zero of=/tmp/big bs=1M count=64 2>/dev/null")
	beforeThreads, beforeFDs := guestThreads(t, sb), guestFDs(t, sb)
	hc := d.unixHTTP(time.Minute)
	var wg sync.WaitGroup
	abandon := func(method, path string, body func(ctx context.Context) *stalledBody, readSome bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, method, "http://agentbox"+path, nil)
			if body != nil {
				req.Body = io.NopCloser(body(ctx))
				req.ContentLength = -1
			}
			resp, err := hc.Do(req)
			if err != nil {
				return
			}
			if readSome {
				_, _ = resp.Body.Read(make([]byte, 1024))
				<-ctx.Done()
			}
			resp.Body.Close()
		}()
	}
	for range 30 {
		abandon("GET", filesPath(sb, "/tmp/fifo"), nil, false)
	}
	var head rawtar.Builder
	head.Add(rawtar.Entry{Name: "f", Mode: 0o644, Size: 1 << 20, Typeflag: '0', Data: make([]byte, 4096)})
	tarHead := head.Bytes()[:rawtar.Block+4096]
	for i := range 10 {
		abandon("GET", filesPath(sb, "/tmp/big"), nil, true)
		abandon("PUT", filesPath(sb, fmt.Sprintf("/tmp/up%d", i)), func(ctx context.Context) *stalledBody {
			return &stalledBody{ctx: ctx, head: make([]byte, 4096)}
		}, false)
		abandon("PUT", "/v1/sandboxes/"+sb.ID()+"/fs/archive?path="+url.QueryEscape(fmt.Sprintf("/tmp/ar%d", i)), func(ctx context.Context) *stalledBody {
			return &stalledBody{ctx: ctx, head: tarHead}
		}, false)
	}
	wg.Wait()
	var afterThreads, afterFDs int
	deadline := time.Now().Add(5 * time.Second)
	for {
		afterThreads, afterFDs = guestThreads(t, sb), guestFDs(t, sb)
		if (afterThreads <= beforeThreads+3 && afterFDs <= beforeFDs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if afterThreads > beforeThreads+3 || afterFDs > beforeFDs {
		t.Fatalf("after 60 abandoned requests guest threads went from %d to %d, descriptors from %d to %d", beforeThreads, afterThreads, beforeFDs, afterFDs)
	}
	// No temporary or partial upload is left behind.
	if out := mustRun(t, sb, "cd /tmp && find . -name '.agentbox-*' -o -name 'up*' -o -path './ar*' -type f"); out != "" {
		t.Fatalf("abandoned uploads left files in /tmp: %s", out)
	}
	// The FIFO was never opened for reading: a writer finds no reader.
	if out := mustRun(t, sb, "timeout 1 sh -c 'echo x > /tmp/fifo' ; echo $?"); strings.TrimSpace(out) == "0" {
		t.Fatalf("a reader of the FIFO is still open in the guest")
	}
}

func uploadArchive(t *testing.T, d *daemon, sb *agentbox.Sandbox, dir string, tarball []byte) (int, string) {
	t.Helper()
	return d.quickRequest(t, "PUT", "/v1/sandboxes/"+sb.ID()+"/fs/archive?path="+url.QueryEscape(dir), tarball, 20*time.Second)
}

// Archive extraction on a sandbox with a small disk: a 10 KiB PAX-sparse
// tar declaring a 2 GiB file, an old-GNU sparse entry, a file declaring
// more than the disk holds, a device entry, an unknown entry type and
// escaping entries are all refused with the right 4xx, leaving no file
// (not even a partial one) behind; legitimate entries still extract.
func TestAdversarialArchiveExtract(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{Resources: api.Resources{DiskBytes: 32 << 20, DiskInodes: 4096}})
	data := bytes.Repeat([]byte("A"), 4096)
	noFile := func(name, dir string) {
		t.Helper()
		if out := mustRun(t, sb, "ls -A "+dir+" 2>/dev/null; true"); strings.TrimSpace(out) != "" {
			t.Errorf("%s: left behind in %s: %s", name, dir, out)
		}
		if out := mustRun(t, sb, "du -sk /root | cut -f1"); strings.TrimSpace(out) != "" {
			if kb, _ := strconv.Atoi(strings.TrimSpace(out)); kb > 1024 {
				t.Errorf("%s: /root holds %d KiB", name, kb)
			}
		}
	}
	var big rawtar.Builder
	big.Add(rawtar.Entry{Name: "big", Mode: 0o644, Size: 1 << 30, Typeflag: '0', Data: data})
	var dev, unknown, escape, hardlink, viaLink, parent rawtar.Builder
	dev.Add(rawtar.Entry{Name: "null", Mode: 0o666, Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3})
	unknown.Add(rawtar.Entry{Name: "odd", Mode: 0o644, Typeflag: 'Z'})
	escape.Add(rawtar.Entry{Name: "../../etc/evil", Mode: 0o644, Size: 1, Typeflag: '0', Data: []byte("x")})
	hardlink.Add(rawtar.Entry{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"})
	viaLink.Add(rawtar.Entry{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}).
		Add(rawtar.Entry{Name: "l/evil", Mode: 0o644, Size: 1, Typeflag: '0', Data: []byte("x")})
	parent.Add(rawtar.Entry{Name: "d/../../evil", Mode: 0o644, Size: 1, Typeflag: '0', Data: []byte("x")})
	for i, tc := range []struct {
		name  string
		tar   []byte
		codes []int
	}{
		{"pax-sparse-1.0-2GiB", rawtar.PAXSparse1("sparse", 2<<30, data), []int{400, 429}},
		{"pax-sparse-0.1-2GiB", rawtar.PAXSparse0("sparse", 2<<30, data), []int{400, 429}},
		{"old-gnu-sparse", rawtar.OldGNUSparse("sparse", 1<<20, data), []int{400}},
		{"declares-1GiB", big.Bytes(), []int{429}},
		{"char-device", dev.Bytes(), []int{400}},
		{"unknown-type", unknown.Bytes(), []int{400}},
		{"escape-dotdot", escape.Bytes(), []int{400}},
		{"escape-hardlink", hardlink.Bytes(), []int{400}},
		{"escape-dotdot-inner", parent.Bytes(), []int{400}},
	} {
		dir := fmt.Sprintf("/root/x%d", i)
		code, body := uploadArchive(t, d, sb, dir, tc.tar)
		ok := false
		for _, c := range tc.codes {
			ok = ok || code == c
		}
		if !ok {
			t.Errorf("%s: %d %s; want %v", tc.name, code, body, tc.codes)
		}
		noFile(tc.name, dir)
	}
	// Many honest files that together overflow the disk: 429 at the
	// first that does not fit; every file left is complete, no temporary
	// file is left.
	var many bytes.Buffer
	tw := tar.NewWriter(&many)
	mib := bytes.Repeat([]byte("B"), 1<<20)
	for i := range 48 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%02d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mib))}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(mib)
	}
	_ = tw.Close()
	if code, body := uploadArchive(t, d, sb, "/root/many", many.Bytes()); code != 429 {
		t.Errorf("48 MiB into a 32 MiB disk: %d %s; want 429", code, body)
	}
	if out := mustRun(t, sb, "cd /root/many && ls -A | grep -v '^f[0-9]*$'; for f in f*; do [ $(wc -c < $f) = 1048576 ] || echo partial $f; done"); out != "" {
		t.Errorf("after a disk-full upload: %s", out)
	}
	mustRun(t, sb, "rm -rf /root/many")

	// Through a symlink the archive planted: refused, nothing in /etc.
	if code, body := uploadArchive(t, d, sb, "/root/y", viaLink.Bytes()); code != 400 {
		t.Errorf("write through planted symlink: %d %s", code, body)
	}
	mustRun(t, sb, "test ! -e /etc/evil && test ! -e /evil && test ! -e /root/evil")

	// Legitimate archives extract: files, dirs, symlinks, hard links, FIFOs.
	var good bytes.Buffer
	tw = tar.NewWriter(&good)
	for _, h := range []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o640, Size: 5},
		{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "f"},
		{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		{Name: "d/p", Typeflag: tar.TypeFifo, Mode: 0o600},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("hello"))
		}
	}
	_ = tw.Close()
	if code, body := uploadArchive(t, d, sb, "/root/good", good.Bytes()); code != 204 {
		t.Fatalf("good archive: %d %s", code, body)
	}
	if got := mustRun(t, sb, "cd /root/good/d && cat f l h && test -p p && stat -c %a f"); got != "hellohellohello640\n" {
		t.Fatalf("good archive content: %q", got)
	}
}
