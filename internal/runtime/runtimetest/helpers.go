package runtimetest

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

// Test id mapping used by the suites: sandbox root is host uid/gid 100000.
var TestIDMap = runtime.IDMap{HostID: 100000, Size: 65536}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error

	layerOnce sync.Once
	layerDir  string // SharedLayer's
)

// TestGuestBinary builds the test guest (package testguest) once per test
// binary with CGO_ENABLED=0 and returns its path. Call RemoveBuildCache
// from TestMain to delete it. Where no Go toolchain runs (the test VM of
// scripts/vmtest.sh), AGENTBOX_TEST_GUEST names a test guest built
// beforehand, which is used as it is.
func TestGuestBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AGENTBOX_TEST_GUEST"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("AGENTBOX_TEST_GUEST: %v", err)
		}
		return p
	}
	goBin := testutil.RequiresBinary(t, "go")
	buildOnce.Do(func() {
		_, file, _, _ := goruntime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "testguest")
		buildDir, buildErr = os.MkdirTemp("", "agentbox-testguest-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command(goBin, "build", "-o", filepath.Join(buildDir, "agentbox"), ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building test guest: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "agentbox")
}

// RemoveBuildCache removes the test guest built by TestGuestBinary and the
// layer of SharedLayer.
func RemoveBuildCache() {
	for _, d := range []string{buildDir, layerDir} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
}

// TempDir returns a fresh t.TempDir with its parents made 0700: layers,
// upper, work and runner dirs in it are reachable by host root only, as
// under a daemon's data dir, so a backend whose guest resolved a host path
// fails the suite.
func TempDir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	for p := d; p != os.TempDir() && p != "/" && p != "."; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(p) == os.TempDir() {
			break
		}
	}
	return d
}

// RunnerDir returns a runner directory holding the test guest as "agentbox".
func RunnerDir(t testing.TB) string {
	t.Helper()
	bin := TestGuestBinary(t)
	dir := TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agentbox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// BusyboxLayer builds a minimal root filesystem from the host's static
// busybox (Debian package busybox-static), owned by the mapped root.
func BusyboxLayer(t testing.TB, m runtime.IDMap) string {
	t.Helper()
	testutil.RequiresFile(t, "/bin/busybox", "package busybox-static")
	if f, err := elf.Open("/bin/busybox"); err != nil {
		t.Fatalf("reading /bin/busybox: %v", err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				f.Close()
				t.Skip("/bin/busybox is dynamically linked; install busybox-static")
			}
		}
		f.Close()
	}
	root := TempDir(t)
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp", "proc", "sys", "dev", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		t.Fatalf("busybox --list-full: %v", err)
	}
	for _, app := range strings.Fields(string(list)) {
		p := filepath.Join(root, app)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/bin/busybox", p); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\ntty:x:5:\nnobody:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ChownTree(t, root, m)
	return root
}

// SharedLayer returns a busybox layer (BusyboxLayer, owned by TestIDMap)
// shared by every test of the test binary: a layer is only ever a
// read-only lower dir. It lies in a directory host root alone may enter,
// as under a daemon's data dir. Call RemoveBuildCache from TestMain to
// delete it. Needs root.
func SharedLayer(t testing.TB) string {
	t.Helper()
	testutil.RequiresRoot(t)
	layerOnce.Do(func() {
		d, err := os.MkdirTemp("", "agentbox-layer-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o700)
		layerDir = d
	})
	layer := filepath.Join(layerDir, "busybox")
	if _, err := os.Stat(layer); err != nil {
		src := BusyboxLayer(t, TestIDMap)
		// t.TempDir vanishes with t: move the tree to the shared dir.
		if err := os.Rename(src, layer); err != nil {
			t.Fatal(err)
		}
	}
	return layer
}

// ChownTree changes the owner of every entry under dir to the mapped root.
func ChownTree(t testing.TB, dir string, m runtime.IDMap) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(m.HostID), int(m.HostID))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// NewSpec returns a spec for id with fresh upper, work, state and socket
// paths under a test temp dir. The state dir is not created (the backend
// does that).
func NewSpec(t testing.TB, id, layer, runnerDir string) runtime.Spec {
	t.Helper()
	base := TempDir(t)
	upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, int(TestIDMap.HostID), int(TestIDMap.HostID)); err != nil {
			t.Fatal(err)
		}
	}
	return runtime.Spec{
		ID:         id,
		Layers:     []string{layer},
		UpperDir:   upper,
		WorkDir:    work,
		RunnerDir:  runnerDir,
		SocketPath: filepath.Join(base, "sock", "guest.sock"),
		StateDir:   filepath.Join(base, "state"),
		Hostname:   id,
		UIDMap:     TestIDMap,
		GIDMap:     TestIDMap,
	}
}

// Exec runs command in the sandbox through the test guest's line protocol
// and returns its combined output and exit code.
func Exec(socketPath, command string, timeout time.Duration) (string, int, error) {
	c, err := net.DialTimeout("unix", socketPath, timeout)
	if err != nil {
		return "", -1, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, command+"\n"); err != nil {
		return "", -1, err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		return string(b), -1, err
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	i := bytes.LastIndex(b, []byte("exit="))
	if i < 0 || (i > 0 && b[i-1] != '\n') {
		return string(b), -1, fmt.Errorf("no exit line in %q", b)
	}
	code, err := strconv.Atoi(string(b[i+len("exit="):]))
	if err != nil {
		return string(b), -1, fmt.Errorf("bad exit line in %q", b)
	}
	return string(b[:i]), code, nil
}

// MustExec is Exec that fails t on a transport error.
func MustExec(t testing.TB, socketPath, command string) (string, int) {
	t.Helper()
	out, code, err := Exec(socketPath, command, 30*time.Second)
	if err != nil {
		t.Fatalf("exec %q: %v (output %q)", command, err, out)
	}
	return out, code
}
