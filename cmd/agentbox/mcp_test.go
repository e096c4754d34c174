package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// bridged returns a client session talking through bridgeMCP to remote.
func bridged(t *testing.T, remote mcp.Transport) (*mcp.ClientSession, chan error) {
	t.Helper()
	toBridge, fromClient := io.Pipe()
	toClient, fromBridge := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- bridgeMCP(context.Background(), &mcp.IOTransport{Reader: toBridge, Writer: fromBridge}, remote)
		fromBridge.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs, errc
}

// The bridge forwards every message both ways and ends cleanly when the
// client closes stdin.
func TestBridgeMCP(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "daemon"}, nil)
	type in struct {
		S string `json:"s"`
	}
	type out struct {
		Upper string `json:"upper"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "upper", Description: "upper-cases s"}, func(_ context.Context, _ *mcp.CallToolRequest, i in) (*mcp.CallToolResult, out, error) {
		return nil, out{strings.ToUpper(i.S)}, nil
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, errc := bridged(t, ct)
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "upper", Arguments: map[string]any{"s": "abc"}})
	if err != nil || r.IsError || r.StructuredContent.(map[string]any)["upper"] != "ABC" {
		t.Fatalf("call through the bridge: %+v, %v", r, err)
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Errorf("bridge ended with %v, want nil at the client's EOF", err)
	}
}

// A daemon that cannot be reached is reported to the client as the
// answer to its request, not a hang.
func TestBridgeMCPDaemonDown(t *testing.T) {
	toBridge, fromClient := io.Pipe()
	toClient, fromBridge := io.Pipe()
	go func() {
		_ = bridgeMCP(context.Background(), &mcp.IOTransport{Reader: toBridge, Writer: fromBridge},
			&mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:1/mcp", HTTPClient: http.DefaultClient, MaxRetries: -1, DisableStandaloneSSE: true})
		fromBridge.Close()
	}()
	_, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(context.Background(), &mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
	if err == nil || !strings.Contains(err.Error(), "agentbox daemon") {
		t.Fatalf("connect through a bridge to no daemon: %v, want the daemon's error", err)
	}
	fromClient.Close()
}
