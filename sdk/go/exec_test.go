package agentbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

func newSandbox(t *testing.T, srv *agentboxtest.Server) *agentbox.Sandbox {
	t.Helper()
	sb, err := newClient(t, srv.Host).Create(context.Background(), agentbox.SandboxSpec{Env: map[string]string{"A": "from-sandbox"}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

func TestRun(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	sb := newSandbox(t, srv)
	ctx := context.Background()
	res, err := sb.Run(ctx, "echo hello; echoerr oops; printenv A; printenv B; pwd; exit 3",
		agentbox.WithEnv(map[string]string{"B": "from-exec"}), agentbox.WithCwd("/tmp"), agentbox.WithUser("1000"),
		agentbox.WithTimeout(90*time.Second))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.ExitCode != 3 || string(res.Stdout) != "hello\nfrom-sandbox\nfrom-exec\n/tmp\n" || string(res.Stderr) != "oops\n" || res.Pid == 0 {
		t.Fatalf("Result = %+v (stdout %q, stderr %q)", res, res.Stdout, res.Stderr)
	}
	req := srv.Sandbox(sb.ID()).Execs()[0]
	if req.Command == "" || req.User != "1000" || req.TimeoutSeconds != 90 || req.Background {
		t.Fatalf("request sent = %+v", req)
	}

	res, err = sb.Run(ctx, "cat", agentbox.WithStdin([]byte("piped")))
	if err != nil || string(res.Stdout) != "piped" || res.ExitCode != 0 {
		t.Fatalf("Run cat = %+v, %v", res, err)
	}
	res, err = sb.Run(ctx, "sleep 5", agentbox.WithTimeout(50*time.Millisecond))
	if err != nil || !res.TimedOut || res.ExitCode != -1 || res.Signal != "KILL" {
		t.Fatalf("Run with timeout = %+v, %v", res, err)
	}
}

// orderWriter records the order in which writes reach the two streams.
type orderWriter struct {
	mu   *sync.Mutex
	log  *[]string
	name string
}

func (w orderWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.log = append(*w.log, w.name+":"+string(b))
	return len(b), nil
}

func TestExecStreamsInterleaved(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	srv.Exec = func(ctx context.Context, p *agentboxtest.Proc) (int, string) {
		for i := range 3 {
			fmt.Fprintf(p.Stdout, "out%d", i)
			fmt.Fprintf(p.Stderr, "err%d", i)
		}
		big := bytes.Repeat([]byte("x"), 1<<20) // one max-size event: a line far beyond bufio's default
		_, _ = p.Stdout.Write(big)
		return 42, ""
	}
	sb := newSandbox(t, srv)
	var mu sync.Mutex
	var log []string
	var startedPid int
	res, err := sb.Exec(context.Background(), api.ExecRequest{Cmd: []string{"anything"}}, agentbox.Streams{
		Stdout:  orderWriter{&mu, &log, "1"},
		Stderr:  orderWriter{&mu, &log, "2"},
		Started: func(p *agentbox.Process) { startedPid = p.Pid() },
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if res.ExitCode != 42 || res.Stdout != nil || res.Stderr != nil || startedPid == 0 || startedPid != res.Pid {
		t.Fatalf("Result = %+v, started pid %d", res, startedPid)
	}
	want := []string{"1:out0", "2:err0", "1:out1", "2:err1", "1:out2", "2:err2"}
	if len(log) != 7 || strings.Join(log[:6], ",") != strings.Join(want, ",") || len(log[6]) != 2+1<<20 {
		t.Fatalf("writes in order %q..., want %q then 1 MiB", log[:min(6, len(log))], want)
	}
}

// fakeStream serves an exec stream with the given NDJSON lines and then
// ends the response.
func fakeStream(t *testing.T, lines ...string) *agentbox.Sandbox {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, l := range lines {
			io.WriteString(w, l)
		}
	}))
	t.Cleanup(ts.Close)
	return newClient(t, ts.URL).Sandbox("sb-1")
}

func TestExecTruncatedStream(t *testing.T) {
	sb := fakeStream(t, `{"type":"started","pid":7}`+"\n", `{"type":"stdout","data":"aGk="}`+"\n")
	var out bytes.Buffer
	res, err := sb.Exec(context.Background(), api.ExecRequest{Command: "x"}, agentbox.Streams{Stdout: &out})
	if !errors.Is(err, agentbox.ErrStreamTruncated) {
		t.Fatalf("Exec over a stream without exit: err = %v, want ErrStreamTruncated", err)
	}
	if out.String() != "hi" || res == nil || res.Pid != 7 {
		t.Fatalf("output before the cut: %q, %+v", out.String(), res)
	}

	sb = fakeStream(t, `{"type":"started","pid":7}`+"\n", `{"type":"exit","exit_co`)
	if _, err := sb.Run(context.Background(), "x"); !errors.Is(err, agentbox.ErrStreamTruncated) {
		t.Fatalf("stream cut inside the exit event: err = %v", err)
	}

	sb = fakeStream(t, `{"type":"started","pid":7}`+"\n", `{"type":"exit","exit_code":0}`) // no final newline
	if res, err := sb.Run(context.Background(), "x"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exit event without newline: %+v, %v", res, err)
	}

	sb = fakeStream(t, `{"type":"error","error":{"code":"unavailable","message":"guest died","request_id":"r9"}}`+"\n")
	_, err = sb.Run(context.Background(), "x")
	if !agentbox.IsUnavailable(err) || agentbox.RequestID(err) != "r9" || !strings.Contains(err.Error(), "guest died") {
		t.Fatalf("error event: %v", err)
	}
}

func TestBackgroundProcess(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	sb := newSandbox(t, srv)
	ctx := context.Background()

	p, err := sb.Start(ctx, api.ExecRequest{Command: "cat", StdinOpen: true})
	if err != nil || p.Pid() == 0 || !p.Info().Running {
		t.Fatalf("Start = %+v, %v", p, err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("hello "))
		pw.Write([]byte("world"))
		pw.Close()
	}()
	if err := p.WriteStdin(ctx, pr, true); err != nil {
		t.Fatalf("WriteStdin: %v", err)
	}
	res, err := sb.Attach(ctx, p.Pid(), true, agentbox.Streams{})
	if err != nil || string(res.Stdout) != "hello world" || res.ExitCode != 0 {
		t.Fatalf("Attach = %+v, %v", res, err)
	}
	procs, err := sb.Processes(ctx)
	if err != nil || len(procs) != 1 || procs[0].Running || procs[0].Pid != p.Pid() {
		t.Fatalf("Processes = %+v, %v", procs, err)
	}

	p, err = sb.Start(ctx, api.ExecRequest{Command: "sleep 30", TTY: &api.TTY{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(ctx, 50, 132); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if err := p.Signal(ctx, "INT"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	res, err = p.Attach(ctx, false, agentbox.Streams{})
	if err != nil || res.ExitCode != -1 || res.Signal != "INT" {
		t.Fatalf("Attach after INT = %+v, %v", res, err)
	}
	if rs := srv.Sandbox(sb.ID()).Resizes(); len(rs) != 1 || rs[0] != (api.TTY{Rows: 50, Cols: 132}) {
		t.Fatalf("resizes = %+v", rs)
	}
	if err := sb.Process(999).Signal(ctx, "KILL"); !agentbox.IsNotFound(err) {
		t.Fatalf("Signal to a missing pid: %v", err)
	}
}
