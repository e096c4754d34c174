package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httpapi"
	"github.com/agentbox/agentbox/internal/templates"
)

// E2B's code-interpreter-v1 is the builtin code-interpreter template.
func TestE2BCodeInterpreterTemplate(t *testing.T) {
	if got := e2b.DefaultTemplates["code-interpreter-v1"]; got != templates.CodeInterpreter {
		t.Fatalf("code-interpreter-v1 maps to %q, want %q", got, templates.CodeInterpreter)
	}
}

// The code port starts a sandbox's server once, as the user "user" in
// /home/user with the runner's code client; a failed start is not
// remembered, and a deleted or forgotten sandbox starts again.
func TestCodePortStartsOnce(t *testing.T) {
	c := newCodePort(slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var reqs []api.ExecRequest
	exit := 0
	c.exec = func(ctx context.Context, id string, req api.ExecRequest) (api.ExecEvent, string, error) {
		mu.Lock()
		defer mu.Unlock()
		reqs = append(reqs, req)
		code := exit
		return api.ExecEvent{Type: api.EventExit, ExitCode: &code}, "", nil
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.ensure(ctx, "aaaaaaaaaaaa") }()
	}
	wg.Wait()
	if len(reqs) != 1 {
		t.Fatalf("%d starts for concurrent first requests, want 1", len(reqs))
	}
	want := append(append([]string{}, httpapi.CodeClient...), "start")
	if r := reqs[0]; !slices.Equal(r.Cmd, want) || r.User != "user" || r.Cwd != "/home/user" {
		t.Fatalf("start request %+v", r)
	}
	c.OnDelete(ctx, "aaaaaaaaaaaa")
	if err := c.ensure(ctx, "aaaaaaaaaaaa"); err != nil || len(reqs) != 2 {
		t.Fatalf("after delete: %v, %d starts", err, len(reqs))
	}
	exit = 1
	if err := c.ensure(ctx, "bbbbbbbbbbbb"); !errdefs.IsUnavailable(err) {
		t.Fatalf("a failed start: %v, want unavailable", err)
	}
	exit = 0
	if err := c.ensure(ctx, "bbbbbbbbbbbb"); err != nil || len(reqs) != 4 {
		t.Fatalf("after a failed start: %v, %d starts", err, len(reqs))
	}
	c.forget("bbbbbbbbbbbb")
	if err := c.ensure(ctx, "bbbbbbbbbbbb"); err != nil || len(reqs) != 5 {
		t.Fatalf("after forget: %v, %d starts", err, len(reqs))
	}
}

// keepBody keeps small bodies to send twice, and leaves a long one
// whole, to stream once.
func TestKeepBody(t *testing.T) {
	r := httptest.NewRequest("POST", "/execute", strings.NewReader(`{"code":"x"}`))
	b, again := keepBody(r, 64)
	rest, _ := io.ReadAll(r.Body)
	if !again || string(b) != `{"code":"x"}` || string(rest) != string(b) {
		t.Fatalf("small body: %q %v, body now %q", b, again, rest)
	}
	long := strings.Repeat("a", 100)
	r = httptest.NewRequest("POST", "/execute", strings.NewReader(long))
	r.ContentLength = -1 // chunked: the length is found by reading
	if _, again := keepBody(r, 64); again {
		t.Fatal("a long body is kept")
	}
	if rest, _ := io.ReadAll(r.Body); string(rest) != long {
		t.Fatalf("long body after keepBody: %d bytes", len(rest))
	}
	r = httptest.NewRequest("GET", "/health", nil)
	if _, again := keepBody(r, 64); !again {
		t.Fatal("no body: not sent again")
	}
}
