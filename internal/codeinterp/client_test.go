package codeinterp

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The client starts the server on first use and speaks E2B's protocol
// to it over HTTP: the same bytes @e2b/code-interpreter sends.
func TestClientServer(t *testing.T) {
	testutil.RequiresBinary(t, "python3")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := New(Config{Cwd: t.TempDir()})
	t.Cleanup(func() { cancel(); s.Close() })
	starts := 0
	c := &Client{Addr: addr, Start: func(addr string) error {
		starts++
		go func() { _ = Serve(ctx, s, addr) }()
		return nil
	}}
	call := func(op, id, in string) (string, error) {
		var out bytes.Buffer
		err := c.Run(context.Background(), op, id, strings.NewReader(in), &out)
		return out.String(), err
	}
	// Listing starts nothing.
	if out, err := call("list", "", ""); err != nil || strings.TrimSpace(out) != `{"contexts":[]}` || starts != 0 {
		t.Fatalf("list before start: %q %v (starts %d)", out, err, starts)
	}
	out, err := call("execute", "", `{"code":"print('a')\n6*7"}`)
	if err != nil || starts != 1 {
		t.Fatalf("execute: %v (starts %d)", err, starts)
	}
	var evs []api.CodeEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev api.CodeEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	if len(evs) != 4 || evs[0].Text != "a\n" || evs[1].Text != "42" || !evs[1].IsMainResult || evs[3].Type != api.CodeEventEndOfExecution {
		t.Fatalf("events %+v", evs)
	}
	out, err = call("create", "", `{"language":"bash"}`)
	var cc api.CodeContext
	if err != nil || json.Unmarshal([]byte(out), &cc) != nil || cc.Language != "bash" || cc.ID == "" {
		t.Fatalf("create: %q %v", out, err)
	}
	if out, err := call("list", "", ""); err != nil || strings.Count(out, `"id"`) != 2 {
		t.Fatalf("list: %q %v", out, err)
	}
	if _, err := call("restart", cc.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := call("delete", cc.ID, ""); err != nil {
		t.Fatal(err)
	}
	out, err = call("delete", cc.ID, "")
	if !errdefs.IsNotFound(err) || !strings.Contains(out, `"type":"stream_error"`) || !strings.Contains(out, `"code":"not_found"`) {
		t.Fatalf("delete again: %q %v", out, err)
	}
	if _, err := call("execute", "", `{"code":"1","language":"cobol"}`); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("unknown language: %v", err)
	}
	if out, err := call("start", "", ""); err != nil || !strings.Contains(out, addr) || starts != 1 {
		t.Fatalf("start: %q %v (starts %d)", out, err, starts)
	}
}
