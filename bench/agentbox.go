package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
)

// daemon is a private `agentbox serve` started for the benchmark.
type daemon struct {
	cmd     *exec.Cmd
	dir     string // private data dir, socket and log live here
	ownDir  bool   // dir was created by us and is removed on stop
	logPath string
	client  *http.Client
	exited  chan struct{}
}

// startDaemon starts bin serve on a socket and data dir under dir (a fresh
// temporary directory when dir is empty) and waits until /v1/health
// answers.
func startDaemon(ctx context.Context, bin, dir string) (*daemon, error) {
	d := &daemon{dir: dir, exited: make(chan struct{})}
	if dir == "" {
		tmp, err := os.MkdirTemp("/var/tmp", "agentbox-bench-")
		if err != nil {
			return nil, err
		}
		d.dir, d.ownDir = tmp, true
		// MkdirTemp makes it 0700; sandbox uids (mapped, unprivileged on
		// the host) must traverse it to reach the daemon's runner dir.
		if err := os.Chmod(tmp, 0o755); err != nil {
			d.removeDir()
			return nil, err
		}
	}
	dataDir := filepath.Join(d.dir, "data")
	sock := filepath.Join(d.dir, "agentbox.sock")
	d.logPath = filepath.Join(d.dir, "serve.log")
	if err := os.MkdirAll(d.dir, 0o755); err != nil { // the daemon creates dataDir
		return nil, err
	}
	_ = os.Remove(sock) // stale socket of an earlier run with the same -data-dir
	logf, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor

	d.cmd = exec.Command(bin, "serve", "--data-dir", dataDir, "--socket", sock)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// No Pdeathsig: it fires when the spawning OS thread exits, and the
	// crun measurement throws locked threads away. stop() ends the daemon.
	if err := d.cmd.Start(); err != nil {
		d.removeDir()
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	go func() { _ = d.cmd.Wait(); close(d.exited) }()

	d.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 4,
	}}

	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := d.health(ctx); err == nil {
			return d, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			d.stop()
			return nil, fmt.Errorf("daemon not healthy after 30s: %w%s", err, d.logTail())
		}
		select {
		case <-d.exited:
			d.stop()
			return nil, fmt.Errorf("daemon exited during start-up (%s)%s", d.cmd.ProcessState, d.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (d *daemon) health(ctx context.Context) error {
	resp, err := d.do(ctx, http.MethodGet, "/v1/health", nil)
	if err != nil {
		return err
	}
	return drain(resp, http.StatusOK)
}

// stop terminates the daemon by its pid (SIGTERM, then SIGKILL after 15 s)
// and removes the data dir when this benchmark created it and nothing is
// still mounted below it.
//
// Sandboxes outlive their daemon (the next one re-adopts them), so every
// sandbox labelled as the benchmark's is deleted first.
func (d *daemon) stop() {
	d.removeLabeled()
	if d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(15 * time.Second):
			fmt.Fprintln(os.Stderr, "bench: daemon ignored SIGTERM for 15s; killing it")
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.removeDir()
}

// benchLabel marks the sandboxes the benchmark creates.
const benchLabel = "agentbox.bench"

// removeLabeled deletes every sandbox carrying benchLabel; a leftover is
// a bug elsewhere in the benchmark, so it is reported.
func (d *daemon) removeLabeled() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := d.do(ctx, http.MethodGet, "/v1/sandboxes?label="+benchLabel+"=1", nil)
	if err != nil {
		return // the daemon is gone; nothing to ask
	}
	defer resp.Body.Close()
	var list api.SandboxList
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil {
		return
	}
	for _, sb := range list.Sandboxes {
		fmt.Fprintln(os.Stderr, "bench: deleting leftover sandbox", sb.ID)
		if err := d.remove(ctx, sb.ID); err != nil {
			fmt.Fprintln(os.Stderr, "bench: cleanup:", err)
		}
	}
}

func (d *daemon) removeDir() {
	if !d.ownDir {
		return
	}
	if m := mountsUnder(d.dir); len(m) > 0 {
		fmt.Fprintf(os.Stderr, "bench: NOT removing %s: still mounted below it: %s\n", d.dir, strings.Join(m, ", "))
		return
	}
	if err := os.RemoveAll(d.dir); err != nil {
		fmt.Fprintln(os.Stderr, "bench: removing", d.dir+":", err)
	}
}

// mountsUnder lists the mount points of this mount namespace at or below dir.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read /proc/self/mountinfo)"}
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func (d *daemon) logTail() string {
	data, err := os.ReadFile(d.logPath)
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return "\n--- tail of " + d.logPath + " ---\n" + string(data)
}

// do sends one request with a JSON body (when body is non-nil).
func (d *daemon) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agentbox"+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set(api.VersionHeader, api.Version)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return d.client.Do(req)
}

// drain reads and closes resp (so the connection is reused) and checks its
// status.
func drain(resp *http.Response, want int) error {
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return statusError(resp)
	}
	_, err := io.Copy(io.Discard, resp.Body)
	return err
}

func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e api.Error
	if json.Unmarshal(body, &e) == nil && e.Code != "" {
		return fmt.Errorf("%s %s: %s: %s: %s (request %s)", resp.Request.Method, resp.Request.URL.Path, resp.Status, e.Code, e.Message, e.RequestID)
	}
	return fmt.Errorf("%s %s: %s: %s", resp.Request.Method, resp.Request.URL.Path, resp.Status, bytes.TrimSpace(body))
}

// buildTemplate builds (or finds cached) the template name and returns
// when the build stream ends.
func (d *daemon) buildTemplate(ctx context.Context, name string) error {
	resp, err := d.do(ctx, http.MethodPost, "/v1/templates/build", api.BuildTemplateRequest{Name: name})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("decoding build event %q: %w", sc.Text(), err)
		}
		switch ev.Type {
		case api.BuildEventDone:
			return nil
		case api.BuildEventError:
			if ev.Error != nil {
				return fmt.Errorf("building template %s: %s: %s", name, ev.Error.Code, ev.Error.Message)
			}
			return fmt.Errorf("building template %s: error event", name)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("building template %s: stream ended without done", name)
}

func (d *daemon) create(ctx context.Context, template string) (string, error) {
	resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes", api.CreateSandboxRequest{
		Template: template,
		Labels:   map[string]string{benchLabel: "1"},
	})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", statusError(resp)
	}
	var sb api.Sandbox
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil {
		return "", fmt.Errorf("decoding sandbox: %w", err)
	}
	if sb.ID == "" {
		return "", errors.New("create returned an empty id")
	}
	return sb.ID, nil
}

// exec runs argv in sandbox id and reads the NDJSON stream to its exit
// event; a non-zero exit is an error.
func (d *daemon) exec(ctx context.Context, id string, argv ...string) error {
	resp, err := d.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/exec", api.ExecRequest{Cmd: argv})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("decoding exec event %q: %w", sc.Text(), err)
		}
		switch ev.Type {
		case api.EventExit:
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				return fmt.Errorf("exec %v: exit event %+v", argv, ev)
			}
			// Read to EOF so the keep-alive connection is reused.
			_, _ = io.Copy(io.Discard, resp.Body)
			return nil
		case api.EventError:
			if ev.Error != nil {
				return fmt.Errorf("exec %v: %s: %s", argv, ev.Error.Code, ev.Error.Message)
			}
			return fmt.Errorf("exec %v: error event", argv)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("exec %v: stream ended without exit", argv)
}

// remove deletes sandbox id; it is meant for cleanup, so it ignores ctx
// cancellation.
func (d *daemon) remove(ctx context.Context, id string) error {
	resp, err := d.do(context.WithoutCancel(ctx), http.MethodDelete, "/v1/sandboxes/"+id, nil)
	if err != nil {
		return err
	}
	return drain(resp, http.StatusNoContent)
}

// measureAgentbox starts a private daemon and measures (a) create→first
// exec completed and (b) the exec round trip on one sandbox.
func measureAgentbox(ctx context.Context, b *bench, bin, dir, template string, buildTimeout time.Duration) []result {
	const (
		createName = "agentbox: POST /v1/sandboxes + exec /bin/true to exit event"
		execName   = "agentbox: exec /bin/true round trip (NDJSON to exit event)"
	)
	fail := func(why string) []result {
		return []result{
			skipped(keyABCreate, groupCreate, createName, why),
			skipped(keyABExec, groupExec, execName, "not measured: "+firstLine(why)),
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return fail(fmt.Sprintf("%s missing: %v", bin, err))
	}
	d, err := startDaemon(ctx, bin, dir)
	if err != nil {
		return fail(err.Error())
	}
	defer d.stop()
	fmt.Fprintf(os.Stderr, "bench: agentbox daemon pid %d in %s; building template %q\n", d.cmd.Process.Pid, d.dir, template)
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	err = d.buildTemplate(bctx, template)
	cancel()
	if err != nil {
		return fail(err.Error() + d.logTail())
	}

	ids := make([]string, b.warmup+b.n)
	samples, err := timeN(ctx, b.n, b.warmup, func(i int) error {
		id, err := d.create(ctx, template)
		if err != nil {
			return err
		}
		ids[i] = id
		return d.exec(ctx, id, "/bin/true")
	}, func(i int) error {
		if ids[i] == "" {
			return nil
		}
		err := d.remove(ctx, ids[i])
		ids[i] = ""
		return err
	})
	for _, id := range ids { // a run that failed between create and delete
		if id != "" {
			if err := d.remove(ctx, id); err != nil {
				fmt.Fprintln(os.Stderr, "bench: cleanup:", err)
			}
		}
	}
	create := measured(keyABCreate, groupCreate, createName, "create→first exec completed; DELETE not timed; unix socket, keep-alive", samples, err)
	if err != nil {
		create.Skip += d.logTail()
	}

	execRow := func() result {
		id, err := d.create(ctx, template)
		if err != nil {
			return skipped(keyABExec, groupExec, execName, err.Error())
		}
		defer func() {
			if err := d.remove(ctx, id); err != nil {
				fmt.Fprintln(os.Stderr, "bench: cleanup:", err)
			}
		}()
		samples, err := timeN(ctx, b.n, b.warmup, func(int) error {
			return d.exec(ctx, id, "/bin/true")
		}, nil)
		return measured(keyABExec, groupExec, execName, "one running sandbox; unix socket, keep-alive", samples, err)
	}()
	return []result{create, execRow}
}
