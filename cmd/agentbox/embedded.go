package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/config"
)

func init() { startEmbedded = startEmbeddedDaemon }

// startEmbeddedDaemon runs a daemon inside this process so that `agentbox run`
// works on a box where no daemon runs. It uses the default data dir (so
// templates built once stay cached, and a later `agentbox serve` re-adopts
// anything left running) and a private socket that lives as long as the
// process.
func startEmbeddedDaemon(ctx context.Context) (host string, stop func(), err error) {
	if os.Geteuid() != 0 {
		return "", nil, fmt.Errorf("no daemon is reachable and an embedded one needs root")
	}
	cfg := config.Default()
	cfg.ApplyEnv()
	cfg.LogLevel = "warn"
	cfg.SocketPath = filepath.Join(filepath.Dir(cfg.SocketPath), fmt.Sprintf("embedded-%d.sock", os.Getpid()))
	cfg.TCPAddr = ""
	if err := cfg.Validate(); err != nil {
		return "", nil, fmt.Errorf("embedded daemon: %w", err)
	}
	stop, err = runDaemon(ctx, cfg)
	if err != nil {
		return "", nil, fmt.Errorf("embedded daemon: %w", err)
	}
	return "unix://" + cfg.SocketPath, stop, nil
}
