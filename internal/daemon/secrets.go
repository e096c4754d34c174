package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/bridge"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/secrets"
)

// setupSecrets loads the master key (outside the data dir), opens the
// encrypted secret store, gives the Manager the store and the run-token
// minter, and registers the API bridge on its tunnel port in every sandbox.
// It must run before Recover (tunnel routes are picked up when a sandbox's
// tunnel opens). The returned store is also what the egress proxy reads
// credentials from; stop closes the bridge.
func setupSecrets(cfg *config.Config, mgr *sandbox.Manager, log *slog.Logger) (_ *secrets.Store, stop func(), err error) {
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
	scoped := sandbox.TenantSecrets{Store: st}
	mgr.SetSecrets(scoped, secrets.NewTokens(key))
	conns, err := bridge.LoadConnectors(cfg.ConnectorsFile)
	if err != nil {
		return nil, nil, err
	}
	br, err := bridge.New(bridge.Config{Connectors: conns, Logger: log}, mgr, scoped, mgr)
	if err != nil {
		return nil, nil, fmt.Errorf("starting the API bridge: %w", err)
	}
	mgr.HandleTunnelPort(bridge.Port, br.ServeConn)
	return st, func() { _ = br.Close() }, nil
}
