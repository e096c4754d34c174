package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/codeinterp"
	"github.com/agentbox/agentbox/internal/errdefs"
)

func init() {
	guestSubcommands = append(guestSubcommands, codeServerCommand, codeClientCommand)
}

// codeServerCommand runs the code interpreter's server inside a sandbox
// (internal/codeinterp); `guest code-client` starts it on first use.
func codeServerCommand() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:    "code-server",
		Short:  "Serve the code interpreter (E2B's protocol) inside a sandbox",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			signal.Ignore(syscall.SIGHUP)
			s := codeinterp.New(codeinterp.Config{Logger: log})
			defer s.Close()
			err := codeinterp.Serve(ctx, s, addr)
			if errdefs.IsAlreadyExists(err) {
				return nil // another client started one first
			}
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "addr", codeinterp.DefaultAddr, "address to listen on")
	return cmd
}

// codeClientCommand makes one request of the code server, starting it
// when none answers, and writes the answer to stdout: what the daemon's
// code API runs through the execute pipeline (docs/CODE-INTERPRETER.md).
func codeClientCommand() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:    "code-client start|execute|create|list|delete ID|restart ID",
		Short:  "Talk to the code interpreter's server inside a sandbox (request body on stdin)",
		Args:   cobra.RangeArgs(1, 2),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			op, id := args[0], ""
			if len(args) == 2 {
				id = args[1]
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			c := &codeinterp.Client{Addr: addr, Start: func(addr string) error {
				return codeinterp.StartDetached(exe, addr, filepath.Join(os.TempDir(), "agentbox-code-server.log"))
			}}
			if err := c.Run(context.Background(), op, id, os.Stdin, os.Stdout); err != nil {
				fmt.Fprintln(os.Stderr, "code-client:", err)
				os.Exit(1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", codeinterp.DefaultAddr, "address of the code server")
	return cmd
}
