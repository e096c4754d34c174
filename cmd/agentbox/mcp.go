package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
)

func init() { extraCommands = append(extraCommands, mcpCmd) }

// mcpCmd is `agentbox mcp`: the daemon's MCP endpoint on stdio.
//
// Design: a thin bridge that forwards each JSON-RPC message between stdio
// and the daemon's POST /mcp (through the Go SDK's streamable HTTP client
// transport), rather than a second MCP server in the client. The tools,
// their schemas, authentication, tenancy and the run records' trigger
// "mcp" therefore exist in one place, the daemon (internal/mcpserver), and
// the bridge needs no update when tools change.
func mcpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve agentbox's sandbox tools over MCP on stdio (for agent frameworks)",
		Long: `Serve agentbox's sandbox tools to an AI agent over the Model Context Protocol
on standard input and output (newline-delimited JSON-RPC), for MCP clients that
start a server as a subprocess (Claude Desktop, IDEs, agent frameworks).

The command is a bridge to the daemon's /mcp endpoint: it connects like every
other client command, to --host / AGENTBOX_HOST with --api-key /
AGENTBOX_API_KEY, and the tools act as that key's tenant. Commands the agent
runs are recorded with trigger "mcp" (agentbox runs --trigger mcp).

Tools: sandbox_create, sandbox_list, sandbox_delete, sandbox_exec, file_read,
file_write, file_list, checkpoint_create, checkpoint_restore, sandbox_fork,
sandbox_diff. Command output and file contents are bounded and returned marked
as untrusted data. See docs/MCP.md for client configuration.

Example client configuration (Claude Desktop's claude_desktop_config.json):
  {"mcpServers": {"agentbox": {"command": "agentbox", "args": ["mcp"],
    "env": {"AGENTBOX_HOST": "https://box.example:8443", "AGENTBOX_API_KEY": "..."}}}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := rootGlobals(cmd).client()
			if err != nil {
				return err
			}
			endpoint, hc := c.MCPEndpoint()
			return bridgeMCP(cmd.Context(), &mcp.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()}},
				&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true})
		},
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// bridgeMCP forwards messages between the local MCP client (local) and the
// daemon (remote) until the local side ends (EOF: a clean exit). A request
// the daemon cannot be reached for is answered locally with a JSON-RPC
// error, so the client sees why instead of waiting forever.
func bridgeMCP(ctx context.Context, local, remote mcp.Transport) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lc, err := local.Connect(ctx)
	if err != nil {
		return err
	}
	defer lc.Close()
	rc, err := remote.Connect(ctx)
	if err != nil {
		return fmt.Errorf("connecting to the daemon's MCP endpoint: %w", err)
	}
	defer rc.Close()

	errc := make(chan error, 1)
	go func() { // daemon -> client
		for {
			msg, err := rc.Read(ctx)
			if err != nil {
				errc <- err
				return
			}
			if err := lc.Write(ctx, msg); err != nil {
				errc <- err
				return
			}
		}
	}()
	for { // client -> daemon
		msg, err := lc.Read(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			select {
			case rerr := <-errc:
				return fmt.Errorf("MCP bridge: %w", rerr)
			default:
			}
			return fmt.Errorf("reading from the MCP client: %w", err)
		}
		if err := rc.Write(ctx, msg); err != nil {
			req, ok := msg.(*jsonrpc.Request)
			if !ok || !req.IsCall() {
				continue
			}
			resp := &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "agentbox daemon: " + err.Error()}}
			if err := lc.Write(ctx, resp); err != nil {
				return err
			}
		}
	}
}
