package codeinterp

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
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Client is the other end of the server, run inside the sandbox by `agentbox
// guest code-client` (what the daemon's code API execs through the
// pipeline): it starts the server when none answers, makes one request and
// writes the answer to its stdout.
type Client struct {
	Addr string // default DefaultAddr
	// Start runs the server in the background (Client.Run starts it when
	// nothing listens on Addr); nil: none is started.
	Start func(addr string) error
	HTTP  *http.Client
}

func (c *Client) addr() string {
	if c.Addr == "" {
		return DefaultAddr
	}
	return c.Addr
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// ensure starts the server unless it answers, and waits until it does.
func (c *Client) ensure(ctx context.Context) error {
	if c.healthy(ctx) {
		return nil
	}
	if c.Start == nil {
		return fmt.Errorf("no code server on %s: %w", c.addr(), errdefs.ErrUnavailable)
	}
	if err := c.Start(c.addr()); err != nil {
		return fmt.Errorf("starting the code server: %v: %w", err, errdefs.ErrUnavailable)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c.healthy(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("the code server did not answer on %s: %w", c.addr(), errdefs.ErrUnavailable)
}

func (c *Client) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr()+"/health", nil)
	resp, err := c.http().Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Run performs op ("start", "execute", "create", "list", "delete",
// "restart"),
// reading a request body from in (execute: ExecuteRequest; create:
// api.CreateCodeContextRequest) and writing to out: execute's NDJSON
// events as they come; create's api.CodeContext; list's
// api.CodeContextList; start's {"addr": ...} once the server answers.
// On failure it writes one api.CodeEvent of type
// stream_error, carrying the error's errdefs code, and returns the error.
func (c *Client) Run(ctx context.Context, op, id string, in io.Reader, out io.Writer) error {
	err := c.run(ctx, op, id, in, out)
	if err != nil {
		b, _ := json.Marshal(api.CodeEvent{Type: api.CodeEventStreamError, Error: &api.Error{Code: errdefs.Code(err), Message: err.Error()}})
		_, _ = out.Write(append(b, '\n'))
	}
	return err
}

func (c *Client) run(ctx context.Context, op, id string, in io.Reader, out io.Writer) error {
	var method, path string
	switch op {
	case "start":
		// Only make sure the server runs: what a front door that speaks
		// to port 49999 directly (E2B's SDK) needs before its first call.
		if err := c.ensure(ctx); err != nil {
			return err
		}
		return json.NewEncoder(out).Encode(map[string]string{"addr": c.addr()})
	case "execute":
		method, path = http.MethodPost, "/execute"
	case "create":
		method, path = http.MethodPost, "/contexts"
	case "list":
		method, path = http.MethodGet, "/contexts"
	case "delete":
		method, path = http.MethodDelete, "/contexts/"+id
	case "restart":
		method, path = http.MethodPost, "/contexts/"+id+"/restart"
	default:
		return fmt.Errorf("unknown operation %q: %w", op, errdefs.ErrInvalidArgument)
	}
	if (op == "delete" || op == "restart") && (id == "" || strings.ContainsAny(id, "/?#%")) {
		return fmt.Errorf("bad context id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var body []byte
	if method == http.MethodPost && in != nil {
		b, err := io.ReadAll(io.LimitReader(in, maxBody+1))
		if err != nil {
			return err
		}
		if len(b) > maxBody {
			return fmt.Errorf("request over %d bytes: %w", maxBody, errdefs.ErrInvalidArgument)
		}
		body = b
	}
	// Only execute and create start a server: with none, there is no
	// context to list, delete or restart.
	if op != "execute" && op != "create" && !c.healthy(ctx) {
		if op == "list" {
			return json.NewEncoder(out).Encode(api.CodeContextList{Contexts: []api.CodeContext{}})
		}
		return fmt.Errorf("context %q: %w", id, errdefs.ErrNotFound)
	}
	if err := c.ensure(ctx); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr()+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("code server: %v: %w", err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct{ Error, Code string }
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			return fmt.Errorf("code server: %s: %s: %w", resp.Status, bytes.TrimSpace(b), errdefs.ErrInternal)
		}
		return fmt.Errorf("%s: %w", strings.TrimSuffix(e.Error, ": "+errdefs.FromCode(e.Code).Error()), errdefs.FromCode(e.Code))
	}
	switch op {
	case "execute":
		return relay(resp.Body, out)
	case "create":
		_, err := io.Copy(out, resp.Body)
		return err
	case "list":
		var l api.CodeContextList
		if err := json.NewDecoder(resp.Body).Decode(&l.Contexts); err != nil {
			return fmt.Errorf("code server: bad context list: %v: %w", err, errdefs.ErrInternal)
		}
		if l.Contexts == nil {
			l.Contexts = []api.CodeContext{}
		}
		return json.NewEncoder(out).Encode(l)
	}
	return nil
}

// relay copies an execute stream line by line, failing when it ends
// before its final event.
func relay(r io.Reader, out io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := out.Write(line); werr != nil {
				return werr
			}
			var ev struct{ Type string }
			if json.Unmarshal(line, &ev) == nil && ev.Type == api.CodeEventEndOfExecution {
				return nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("code server stream: %v: %w", err, errdefs.ErrUnavailable)
		}
	}
}

// StartDetached runs `exe guest code-server --addr addr` in a session of
// its own, detached from the caller, its output appended to logPath (or
// discarded when that cannot be opened: an image without /tmp).
func StartDetached(exe, addr, logPath string) error {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		if logf, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0); err != nil {
			return err
		}
	}
	defer logf.Close()
	cmd := exec.Command(exe, "guest", "code-server", "--addr", addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// Serve listens on addr and serves s until ctx ends. Another server
// already on addr is not an error (errdefs.ErrAlreadyExists is returned).
func Serve(ctx context.Context, s *Server, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listening on %s: %w", addr, errdefs.ErrAlreadyExists)
		}
		return err
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = hs.Close() })
	defer stop()
	err = hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
