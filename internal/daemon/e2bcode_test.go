package daemon

import (
	"context"
	"log/slog"
	"slices"
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
