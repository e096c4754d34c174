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
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (env "+config.EnvDataDir+")")
	f.StringVar(&cfg.SocketPath, "socket", cfg.SocketPath, "unix socket of the API (env "+config.EnvSocket+")")
	f.StringVar(&cfg.TCPAddr, "tcp", cfg.TCPAddr, "also serve the API on this TCP host:port, with API keys (env "+config.EnvTCP+")")
	f.StringVar(&cfg.APIKeysFile, "api-keys-file", cfg.APIKeysFile, "file of admin API keys for the TCP listener, one per line; tenants' keys are created with \"agentbox key create\" (env "+config.EnvAPIKeysFile+")")
	f.StringSliceVar(&cfg.AllowedHosts, "allowed-host", cfg.AllowedHosts, "Host header values accepted on TCP: host or host:port, * for any (repeatable; default: IP literals and localhost only)")
	f.StringVar(&cfg.TLSCertFile, "tls-cert", cfg.TLSCertFile, "PEM certificate (chain) of the TCP listener, which then speaks only TLS (env "+config.EnvTLSCert+")")
	f.StringVar(&cfg.TLSKeyFile, "tls-key", cfg.TLSKeyFile, "PEM private key of --tls-cert (env "+config.EnvTLSKey+")")
	f.BoolVar(&cfg.InsecureTCP, "insecure-tcp", cfg.InsecureTCP, "allow --tcp on a non-loopback address without TLS, API keys in clear text (env "+config.EnvInsecureTCP+")")
	f.IntVar(&cfg.MaxConns, "max-conns", cfg.MaxConns, "TCP connections at most (0: from the open-file limit, keeping a reserve for the unix socket and sandboxes)")
	f.IntVar(&cfg.MaxConnsPerAddr, "max-conns-per-addr", cfg.MaxConnsPerAddr, "TCP connections per client address (IPv6: per /64) at most (0: derived)")
	f.Float64Var(&cfg.TCPRequestRate, "tcp-rate", cfg.TCPRequestRate, "requests per second each tenant (and the admin keys) may make on TCP on average; over it: 429 with Retry-After (0: no limit)")
	f.IntVar(&cfg.TCPRequestBurst, "tcp-burst", cfg.TCPRequestBurst, "requests a tenant may make on TCP at once, above --tcp-rate")
	f.StringVar(&cfg.DefaultTemplate, "default-template", cfg.DefaultTemplate, "template of sandboxes that name none")
	f.StringVar(&cfg.Runtime, "runtime", cfg.Runtime, "isolation backend of sandboxes whose create names none (env "+config.EnvRuntime+")")
	f.StringVar(&cfg.SecretsKeyFile, "secrets-key-file", cfg.SecretsKeyFile, "master key of the secret store and run tokens, outside the data dir; created when missing (env "+config.EnvSecretsKeyFile+")")
	f.StringVar(&cfg.ConnectorsFile, "connectors-file", cfg.ConnectorsFile, "JSON array of API bridge connectors [{name, url, secret, header, format}] (env "+config.EnvConnectorsFile+")")
	f.StringSliceVar(&cfg.EgressPermit, "egress-permit", cfg.EgressPermit, "internal address range the egress proxy may dial, CIDR or ADDR with an optional :PORT or :* (repeatable; env "+config.EnvEgressPermit+", comma-separated); loopback, link-local, private, CGNAT, ULA and the host's own addresses are unreachable from sandboxes otherwise, whatever their rules say")
	f.StringToIntVar(&cfg.WarmPools, "warm-pool", cfg.WarmPools, "paused sandboxes kept ready per template, e.g. busybox=2 (repeatable; env "+config.EnvWarmPools+")")
	f.Int64Var(&cfg.DefaultResources.DiskBytes, "default-disk-bytes", cfg.DefaultResources.DiskBytes, "writable layer size of sandboxes that ask for none (0: no default disk limit)")
	f.Int64Var(&cfg.DefaultResources.DiskInodes, "default-disk-inodes", cfg.DefaultResources.DiskInodes, "writable layer inodes of sandboxes that ask for none (scaled down for a smaller disk_bytes)")
	f.Int64Var(&cfg.MaxDiskBytes, "max-disk-bytes", cfg.MaxDiskBytes, "most disk_bytes a tenant's sandbox may have (0: the default's)")
	f.Int64Var(&cfg.MaxDiskInodes, "max-disk-inodes", cfg.MaxDiskInodes, "most disk_inodes a tenant's sandbox may have (0: the default's)")
	f.Int64Var(&cfg.DefaultResources.OpenFiles, "default-open-files", cfg.DefaultResources.OpenFiles, "RLIMIT_NOFILE of sandboxes that ask for none (0: inherited)")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error (env "+config.EnvLogLevel+")")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json (env "+config.EnvLogFormat+")")
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
