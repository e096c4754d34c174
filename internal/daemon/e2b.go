package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/pipeline"
	"github.com/agentbox/agentbox/internal/ratelimit"
	"github.com/agentbox/agentbox/internal/tenant"
)

// e2bService is the service as the E2B front end sees it: the same
// methods, with Exec the E2B trigger of the pipeline (run records say
// trigger e2b, who the request's key or sandbox token).
type e2bService struct{ service }

var _ e2b.Sandboxes = e2bService{}

// Exec implements e2b.Sandboxes.
func (s e2bService) Exec(ctx context.Context, id string, req api.ExecRequest) (execstream.Stream, error) {
	exe, err := s.pipelineAPI.p.Execute(ctx, pipeline.Run{Trigger: api.TriggerE2B, Who: e2b.CallerFrom(ctx), SandboxID: id, Exec: req})
	if err != nil {
		return nil, err
	}
	return exe.Stream, nil
}

// SandboxStats implements e2b.Sandboxes (sandbox.Handle.Stats).
func (s e2bService) SandboxStats(ctx context.Context, id string) (e2b.Stats, error) {
	h, err := s.Manager.Handle(ctx, id)
	if err != nil {
		return e2b.Stats{}, err
	}
	st, err := h.Stats(ctx)
	if err != nil {
		return e2b.Stats{}, err
	}
	return e2b.Stats{CPUTime: st.CPUTime, MemoryBytes: st.MemoryBytes}, nil
}

// e2bHandler builds the E2B front end: X-API-KEY is a key of the keys
// file (the admin tenant) or a tenant's key, as on the TCP API.
func (d *Daemon) e2bHandler() (http.Handler, error) {
	templates, err := e2b.ParseTemplateMap(d.cfg.E2BTemplates)
	if err != nil {
		return nil, err
	}
	sums := make([][sha256.Size]byte, 0, len(d.cfg.APIKeys))
	for _, k := range d.cfg.APIKeys {
		sums = append(sums, sha256.Sum256([]byte(k)))
	}
	reg := d.tenants.reg
	auth := func(key string) (tenant.Principal, error) {
		sum := sha256.Sum256([]byte(key))
		match := 0
		for i := range sums { // no early exit: time does not depend on which key matched
			match |= subtle.ConstantTimeCompare(sum[:], sums[i][:])
		}
		if match == 1 {
			return tenant.Admin, nil
		}
		if reg != nil {
			if p, err := reg.Authenticate(key); err == nil {
				return p, nil
			}
		}
		return tenant.Principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	cfg := e2b.Config{
		Authenticate: auth, Templates: templates, Logger: d.log,
		RateLimit: ratelimit.New(d.cfg.TCPRequestRate, d.cfg.TCPRequestBurst),
	}
	if reg != nil {
		cfg.Track = reg.Track // a revoked key ends its open requests
	}
	// The code interpreter's port, through serviceurl's proxy.
	d.codePort.bind(e2bService{d.svc}, d.services.Proxy())
	cfg.Ports = map[int]e2b.PortHandler{e2b.CodeInterpreterPort: d.codePort}
	if d.cfg.ServiceDomain != "" {
		// {port}-{id}.{domain}, as the SDK addresses sandboxes without
		// E2B_SANDBOX_URL.
		cfg.Domain = d.cfg.ServiceDomain
		cfg.Hosts = newE2BHosts(d.cfg.ServiceDomain, d.services)
	}
	return e2b.New(e2bService{d.svc}, cfg)
}

// WatchDir implements e2b.Watcher.
func (s e2bService) WatchDir(ctx context.Context, id, path string, recursive bool) (e2b.FSEvents, error) {
	w, err := s.Files.Watch(ctx, id, path, recursive)
	if err != nil {
		return nil, err
	}
	return w, nil
}
