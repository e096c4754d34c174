package test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestExecAndFiles drives exec and file operations of a real sandbox through
// the SDK.
func TestExecAndFiles(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Env: map[string]string{"GREETING": "hello"}, Labels: map[string]string{"k": "v"}})

	t.Run("ExitCodesAndStreams", func(t *testing.T) {
		res := run(t, sb, "echo out; echo err >&2; exit 7")
		if res.ExitCode != 7 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			t.Fatalf("got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("EnvCwdUserStdin", func(t *testing.T) {
		if out := mustRun(t, sb, "echo $GREETING $EXTRA", agentbox.WithEnv(map[string]string{"EXTRA": "world"})); out != "hello world\n" {
			t.Fatalf("env: %q", out)
		}
		if out := mustRun(t, sb, "pwd", agentbox.WithCwd("/tmp")); out != "/tmp\n" {
			t.Fatalf("cwd: %q", out)
		}
		if out := mustRun(t, sb, "id -u", agentbox.WithUser("nobody")); strings.TrimSpace(out) == "0" {
			t.Fatalf("user nobody ran as root")
		}
		if out := mustRun(t, sb, "cat", agentbox.WithStdin([]byte("from stdin"))); out != "from stdin" {
			t.Fatalf("stdin: %q", out)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		res := run(t, sb, "sleep 30", agentbox.WithTimeout(300*time.Millisecond))
		if !res.TimedOut || time.Since(start) > 10*time.Second {
			t.Fatalf("timeout not enforced: %+v after %v", res, time.Since(start))
		}
	})
	t.Run("BackgroundAndReattach", func(t *testing.T) {
		p, err := sb.Start(ctx, api.ExecRequest{Command: "for i in 1 2 3; do echo line$i; sleep 0.1; done"})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		res, err := p.Attach(ctx, true, agentbox.Streams{Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || out.String() != "line1\nline2\nline3\n" {
			t.Fatalf("re-attach: exit %d output %q", res.ExitCode, out.String())
		}
	})
	t.Run("InteractiveStdin", func(t *testing.T) {
		// Input written to an open stdin stream reaches the process at
		// once, not when the stream ends or a buffer fills.
		p, err := sb.Start(ctx, api.ExecRequest{Command: "read line; echo got:$line; read line2; echo got:$line2", StdinOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() { done <- p.WriteStdin(ctx, pr, true) }()
		if _, err := pw.Write([]byte("first\n")); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			procs, err := sb.Processes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, _ = p.Attach(actx, true, agentbox.Streams{Stdout: &out})
			cancel()
			if strings.Contains(out.String(), "got:first") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("first line did not reach the process while stdin stayed open (output %q, procs %+v)", out.String(), procs)
			}
		}
		_, _ = pw.Write([]byte("second\n"))
		pw.Close()
		if err := <-done; err != nil {
			t.Fatalf("stdin stream: %v", err)
		}
		var out bytes.Buffer
		res, err := p.Attach(ctx, true, agentbox.Streams{Stdout: &out})
		if err != nil || res.ExitCode != 0 || out.String() != "got:first\ngot:second\n" {
			t.Fatalf("interactive stdin: %v exit %v output %q", err, res, out.String())
		}
	})
	t.Run("PTY", func(t *testing.T) {
		var out bytes.Buffer
		res, err := sb.Exec(ctx, api.ExecRequest{Command: "tty && stty size", TTY: &api.TTY{Rows: 33, Cols: 101}}, agentbox.Streams{Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || !strings.Contains(out.String(), "/dev/pts/") || !strings.Contains(out.String(), "33 101") {
			t.Fatalf("pty: exit %d output %q", res.ExitCode, out.String())
		}
	})
	t.Run("Signal", func(t *testing.T) {
		p, err := sb.Start(ctx, api.ExecRequest{Command: "sleep 60"})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Signal(ctx, "TERM"); err != nil {
			t.Fatal(err)
		}
		res, err := p.Attach(ctx, false, agentbox.Streams{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Signal != "TERM" {
			t.Fatalf("signal: %+v", res)
		}
	})
	t.Run("LargeFileRoundTrip", func(t *testing.T) {
		data := make([]byte, 40<<20)
		_, _ = rand.Read(data)
		if err := sb.WriteFile(ctx, "/root/big.bin", data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := sb.ReadFile(ctx, "/root/big.bin")
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatal("large file changed in the round trip")
		}
		sum := strings.Fields(mustRun(t, sb, "sha256sum /root/big.bin"))[0]
		want := sha256.Sum256(data)
		if sum != hex.EncodeToString(want[:]) {
			t.Fatalf("sha256 inside %s, want %x", sum, want)
		}
	})
	t.Run("FileOps", func(t *testing.T) {
		if err := sb.Mkdir(ctx, "/work/a/b", true); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "/work/a/b/f.txt", []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
		fi, err := sb.Stat(ctx, "/work/a/b/f.txt")
		if err != nil || fi.Size != 1 || fi.Mode&0o777 != 0o640 || fi.Type != api.FileTypeFile {
			t.Fatalf("stat: %+v %v", fi, err)
		}
		if err := sb.Move(ctx, "/work/a/b/f.txt", "/work/g.txt"); err != nil {
			t.Fatal(err)
		}
		list, err := sb.ListDir(ctx, "/work")
		if err != nil || len(list) != 2 {
			t.Fatalf("list: %+v %v", list, err)
		}
		if err := sb.Remove(ctx, "/work", true); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Stat(ctx, "/work"); !agentbox.IsNotFound(err) {
			t.Fatalf("stat after remove: %v", err)
		}
	})
	t.Run("TarRoundTrip", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		files := map[string]string{"a.txt": "A", "sub/b.txt": "B"}
		for name, body := range files {
			_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			_, _ = tw.Write([]byte(body))
		}
		_ = tw.Close()
		if err := sb.UploadDir(ctx, "/srv/up", &buf); err != nil {
			t.Fatal(err)
		}
		if out := mustRun(t, sb, "cat /srv/up/a.txt /srv/up/sub/b.txt"); out != "AB" {
			t.Fatalf("uploaded content: %q", out)
		}
		rc, err := sb.DownloadDir(ctx, "/srv/up")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		got := map[string]string{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				b, _ := io.ReadAll(tr)
				got[strings.TrimPrefix(h.Name, "./")] = string(b)
			}
		}
		for name, body := range files {
			if got[name] != body {
				t.Fatalf("downloaded %s = %q, want %q (all: %v)", name, got[name], body, got)
			}
		}
	})
	t.Run("ListByLabel", func(t *testing.T) {
		sbs, err := d.client.List(ctx, map[string]string{"k": "v"})
		if err != nil || len(sbs) != 1 || sbs[0].ID() != sb.ID() {
			t.Fatalf("list by label: %v %v", sbs, err)
		}
		sbs, err = d.client.List(ctx, map[string]string{"k": "other"})
		if err != nil || len(sbs) != 0 {
			t.Fatalf("list by other label: %v %v", sbs, err)
		}
	})
}

// TestAPIRejectsBadInput sends hostile requests to the real daemon: each gets
// a clear 4xx JSON error with a request id, never a 5xx.
func TestAPIRejectsBadInput(t *testing.T) {
	d := newDaemon(t)
	sb := d.create(t, agentbox.SandboxSpec{})
	id := sb.ID()
	long := "/" + strings.Repeat("a", 5000)
	cases := []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v1/sandboxes", `{"template":`, 400},
		{"POST", "/v1/sandboxes", `{"bogus_field":1}`, 400},
		{"POST", "/v1/sandboxes", `{"template":"busybox"} trailing`, 400},
		{"POST", "/v1/sandboxes", `{"template":"no-such-template"}`, 404},
		{"POST", "/v1/sandboxes", `{"resources":{"cpus":-1}}`, 400},
		{"POST", "/v1/sandboxes", `{"env":{"A=B":"x"}}`, 400},
		{"POST", "/v1/sandboxes", `{"template":"` + strings.Repeat("x", 2<<20) + `"}`, 413},
		{"GET", "/v1/sandboxes/doesnotexist0", ``, 404},
		{"GET", "/v1/sandboxes/BAD!ID", ``, 400},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{}`, 400},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"cmd":["true"],"cwd":"relative"}`, 400},
		{"GET", "/v1/sandboxes/" + id + "/files?path=/etc/pass%00wd", ``, 400},
		{"GET", "/v1/sandboxes/" + id + "/files?path=relative", ``, 400},
		{"GET", "/v1/sandboxes/" + id + "/files?path=" + long, ``, 400},
		{"GET", "/v1/sandboxes/" + id + "/files?path=/no/such/file", ``, 404},
		{"GET", "/v1/sandboxes/" + id + "/processes/notapid/attach", ``, 400},
		{"GET", "/v1/nope", ``, 404},
	}
	for _, c := range cases {
		status, body := d.rawRequest(t, c.method, c.path, []byte(c.body))
		var e api.Error
		if err := json.Unmarshal(body, &e); err != nil || e.Code == "" || e.RequestID == "" {
			t.Errorf("%s %s: body %q is not an error with code and request id", c.method, c.path, truncate(body))
		}
		if status != c.want {
			t.Errorf("%s %s: status %d, want %d (body %s)", c.method, c.path, status, c.want, truncate(body))
		}
	}
	// The daemon is still healthy and the sandbox still works.
	if out := mustRun(t, sb, "echo ok"); out != "ok\n" {
		t.Fatalf("after bad input: %q", out)
	}
	status, _ := d.rawRequest(t, http.MethodGet, "/v1/openapi.yaml", nil)
	if status != 200 {
		t.Fatalf("openapi.yaml: %d", status)
	}
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
