package inproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/chanlisten"
	"github.com/agentbox/agentbox/internal/guest/proto"
)

// The default guest runs in the test process, whose "/" is the host's: a
// path a client names ("/etc/machine-id", an archive written at "/") would
// be the host's file. rootProxy stands between the sandbox socket and the
// embedded guest and rewrites every path of a request header (file
// operations, mkdir, move, an exec's cwd) to lie beneath the sandbox's
// root directory, and the paths of the FileInfo replies back. It is a
// guard for tests, not a boundary: a symlink below root that points
// outside is still followed by the guest, and processes run on the host.

// headerTimeout bounds the wait for a client's request header.
const headerTimeout = 10 * time.Second

// serveRooted accepts clients on outer and serves each through the guest
// listening on inner, its paths rewritten beneath root, until outer fails.
func serveRooted(outer net.Listener, inner *chanlisten.Listener, root string, after func()) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := outer.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if proxyConn(c, inner, root) {
				after()
			}
		}()
	}
}

// proxyConn serves one client connection. It reports whether the request
// may have changed files (anything but a read).
func proxyConn(c net.Conn, inner *chanlisten.Listener, root string) (wrote bool) {
	defer c.Close()
	done := make(chan struct{})
	defer close(done)
	go func() { // the guest stopped: so does this connection
		select {
		case <-inner.Done():
			c.Close()
		case <-done:
		}
	}()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	req, err := proto.ReadRequest(br)
	if err != nil {
		bw := bufio.NewWriter(c)
		if proto.WriteJSONFrame(bw, proto.FrameError, proto.NewError(err)) == nil {
			_ = bw.Flush()
		}
		return false
	}
	_ = c.SetReadDeadline(time.Time{})
	rewriteRequest(req, root)
	wrote = !readOnly(req.Op)
	ours, theirs, err := unixPair()
	if err != nil {
		return false
	}
	defer ours.Close()
	if !inner.Deliver(theirs) {
		theirs.Close()
		return false
	}
	if err := proto.WriteRequest(ours, req); err != nil {
		return false
	}
	go func() {
		_, _ = io.Copy(ours, br)
		_ = ours.CloseWrite()
	}()
	if fileReply(req.Op) {
		_ = copyFrames(c, ours, root)
	} else {
		_, _ = io.Copy(c, ours)
	}
	return wrote
}

// readOnly reports whether op changes no file.
func readOnly(op string) bool {
	switch op {
	case proto.OpVersion, proto.OpProcesses, proto.OpReadFile, proto.OpStat, proto.OpList, proto.OpReadArchive, proto.OpSignal, proto.OpResize:
		return true
	}
	return false
}

// unixPair returns the two ends of a unix stream socketpair.
func unixPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "inproc-guest")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				syscall.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}

// rewriteRequest puts the request's paths beneath root. "/" itself stays
// "/" where the guest refuses it (writing, moving or removing the root).
func rewriteRequest(req *proto.Request, root string) {
	keepSlash := req.Op == proto.OpWriteFile || req.Op == proto.OpMove || req.Op == proto.OpRemove
	under := func(p string) string {
		if proto.CheckPath(p) != nil {
			return p // the guest refuses it as it is
		}
		p = filepath.Clean(p)
		if p == "/" && keepSlash {
			return p
		}
		return filepath.Join(root, p)
	}
	if req.Path != "" {
		req.Path = under(req.Path)
	}
	if req.Mkdir != nil {
		m := *req.Mkdir
		m.Path = under(m.Path)
		req.Mkdir = &m
	}
	if req.Move != nil {
		m := *req.Move
		m.From, m.To = under(m.From), under(m.To)
		req.Move = &m
	}
	if req.Exec != nil {
		e := *req.Exec
		if e.Cwd == "" {
			e.Cwd = root
		} else {
			e.Cwd = under(e.Cwd)
		}
		req.Exec = &e
	}
}

// fileReply reports whether op's Result frames carry FileInfo.
func fileReply(op string) bool {
	switch op {
	case proto.OpReadFile, proto.OpWriteFile, proto.OpStat, proto.OpList, proto.OpMkdir:
		return true
	}
	return false
}

// copyFrames copies the guest's frames to the client, with the root
// taken off every "path" of a Result frame.
func copyFrames(w io.Writer, r io.Reader, root string) error {
	br := bufio.NewReader(r)
	bw := bufio.NewWriter(w)
	for {
		t, b, err := proto.ReadFrame(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return bw.Flush()
			}
			return err
		}
		if t == proto.FrameResult {
			b = stripRoot(b, root)
		}
		if err := proto.WriteFrame(bw, t, b); err != nil {
			return err
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
	}
}

// stripRoot rewrites the "path" fields of a JSON FileInfo or list of
// them; anything else is returned as it is.
func stripRoot(b []byte, root string) []byte {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	fix := func(m map[string]any) {
		if p, ok := m["path"].(string); ok {
			if rel, ok := strings.CutPrefix(p, root); ok && (rel == "" || rel[0] == '/') {
				if rel == "" {
					rel = "/"
				}
				m["path"] = rel
			}
		}
	}
	switch x := v.(type) {
	case map[string]any:
		fix(x)
	case []any:
		for _, e := range x {
			if m, ok := e.(map[string]any); ok {
				fix(m)
			}
		}
	default:
		return b
	}
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

// serveGuestRooted runs serve on a chanListener fed by a rootProxy on ln,
// until ctx is done; after is called when a request that may have written
// files has been served.
func serveGuestRooted(ctx context.Context, ln net.Listener, root string, after func(), serve func(context.Context, net.Listener) error) error {
	inner := chanlisten.New(&net.UnixAddr{Name: "inproc", Net: "unix"})
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	proxied := make(chan struct{})
	go func() {
		defer close(proxied)
		serveRooted(ln, inner, root, after)
	}()
	err := serve(ctx, inner)
	ln.Close()
	inner.Close()
	<-proxied
	return err
}
