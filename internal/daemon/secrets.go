package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/bridge"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runsecrets"
	"github.com/agentbox/agentbox/internal/sandboxevents"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/tunnel"
)

// openSecrets loads the master key (outside the data dir), opens the
// encrypted secret store and builds the runsecrets extension (exec
// secrets, run tokens, redaction) on it. The returned store is also what
// the egress proxy reads credentials from.
func openSecrets(cfg *config.Config, log *slog.Logger) (*runsecrets.Secrets, *secrets.Store, error) {
	key, err := secrets.LoadOrCreateKey(cfg.SecretsKeyFile)
	if err != nil {
		return nil, nil, err
	}
	st, err := secrets.OpenStore(filepath.Join(cfg.DataDir, "secrets.json"), key)
	if err != nil {
		return nil, nil, err
	}
	// Every name is the tenant's own: the caller's on the API, the
	// sandbox owner's for exec secrets, bridge connectors and egress.
	scoped := runsecrets.TenantSecrets{Store: st}
	return runsecrets.New(runsecrets.Config{Store: scoped, Tokens: secrets.NewTokens(key), Logger: log}), st, nil
}

// startBridge registers the API bridge on its tunnel port in every
// sandbox: run tokens are verified by sec, events go to events. It runs
// before the Manager is built (tunnel routes are picked up when a
// sandbox's tunnel opens); stop closes the bridge.
func startBridge(cfg *config.Config, tun *tunnel.Tunnels, sec *runsecrets.Secrets, events *sandboxevents.Recorder, log *slog.Logger) (stop func(), err error) {
	conns, err := bridge.LoadConnectors(cfg.ConnectorsFile)
	if err != nil {
		return nil, err
	}
	br, err := bridge.New(bridge.Config{Connectors: conns, Logger: log}, sec, sec.Store(), events)
	if err != nil {
		return nil, fmt.Errorf("starting the API bridge: %w", err)
	}
	tun.HandlePort(bridge.Port, br.ServeConn)
	return func() { _ = br.Close() }, nil
}
