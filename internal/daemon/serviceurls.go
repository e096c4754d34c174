package daemon

import (
	"context"
	"log/slog"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/secrets"
	"github.com/agentbox/agentbox/internal/serviceurl"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tunnel"
)

// openServiceURLs builds the service URL feature (internal/serviceurl):
// its tokens are keyed by keys derived from the master key (outside the
// data dir), its exposures kept in the metadata store.
// Ports the tunnel routes (the API bridge, the egress proxy) are never
// exposed.
func openServiceURLs(ctx context.Context, cfg *config.Config, st store.ExposureStore, tun *tunnel.Tunnels, log *slog.Logger) (*serviceurl.Exposures, error) {
	key, err := secrets.LoadOrCreateKey(cfg.SecretsKeyFile)
	if err != nil {
		return nil, err
	}
	signer, err := serviceurl.NewSigner(key.Derive(serviceurl.PurposeTokens), key.Derive(serviceurl.PurposeLinks))
	if err != nil {
		return nil, err
	}
	return serviceurl.New(ctx, serviceurl.Config{
		Store:     st,
		Signer:    signer,
		Domain:    cfg.ServiceDomain,
		PublicURL: cfg.ServicePublicURL(),
		Reserved:  tun.Routed,
		Logger:    log,
	})
}

// exposureAPI adapts the feature to httpapi.ExposureService (a named
// field, not an embedding: the feature's hook methods must not be
// promoted into service).
type exposureAPI struct{ x *serviceurl.Exposures }

func (e exposureAPI) Expose(ctx context.Context, id string, req api.ExposeRequest) (api.Exposure, error) {
	return e.x.Expose(ctx, id, req)
}

func (e exposureAPI) ListExposures(ctx context.Context, id string) ([]api.Exposure, error) {
	return e.x.ListExposures(ctx, id)
}

func (e exposureAPI) RevokeExposure(ctx context.Context, id string) error {
	return e.x.RevokeExposure(ctx, id)
}

func (e exposureAPI) ExposureLink(ctx context.Context, id string) (api.Exposure, error) {
	return e.x.ExposureLink(ctx, id)
}
