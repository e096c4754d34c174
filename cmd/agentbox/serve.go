package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/daemon"
)

func init() { extraCommands = append(extraCommands, serveCommand) }

func serveCommand() *cobra.Command {
	cfg := config.Default()
	cfg.ApplyEnv()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the agentbox daemon",
		Long: `Run the agentbox daemon: the HTTP API on a root-only unix socket (and
optionally on TCP with API keys), sandboxes under the data dir.

Stopping the daemon (SIGINT/SIGTERM) leaves sandboxes running; the next
daemon re-adopts them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.LoadAPIKeys(); err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("invalid configuration: %w", err)
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("agentbox serve must run as root (it creates namespaces and cgroups)")
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			stop, err := runDaemon(ctx, cfg)
			if err != nil {
				return err
			}
			<-ctx.Done()
			stop()
			return nil
		},
	}
	cfg.BindFlags(cmd.Flags()) // every flag and its variable: internal/config/settings.go
	return cmd
}

// runDaemon is shared by serve and the embedded daemon: it starts a daemon on
// cfg, serving once it returns, and returns a stop function that shuts it
// down gracefully (sandboxes keep running).
func runDaemon(ctx context.Context, cfg *config.Config) (stop func(), err error) {
	log := cfg.NewLogger(os.Stderr)
	log.Info("starting agentbox daemon", "config", cfg.Redacted())
	d, err := daemon.New(ctx, cfg, daemon.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		_ = d.Close()
		return nil, err
	}
	return func() { _ = d.Close() }, nil
}
