// Package sandboxnet applies sandboxes' network specs (mode "none" or
// "egress", allow/deny rules, credentials) at the host-side egress proxy,
// installs its interception CA inside each sandbox and points the proxy
// variables of every exec at it.
//
// It is a feature attached to the sandbox core: a prepare hook validates
// create requests' specs, create, start and recover hooks apply them, an
// exec wrapper sets the environment and a delete hook forgets the sandbox
// at the edge.
package sandboxnet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/tunnel"
)

// NetworkEdge is the host-side egress proxy sandboxes' network policies
// are applied to (implemented by *egress.Proxy). Connections reach it
// over each sandbox's reverse tunnel on api.EgressProxyAddr.
type NetworkEdge interface {
	// Validate checks a spec without applying it.
	Validate(spec api.NetworkSpec) error
	// Configure installs or replaces a sandbox's policy, keeping its
	// interception CA in stateDir, and returns the CA certificate (PEM).
	Configure(sandboxID, stateDir string, spec api.NetworkSpec) ([]byte, error)
	// Remove forgets a sandbox.
	Remove(sandboxID string)
	// ServeConn serves one proxy connection made inside a sandbox.
	ServeConn(ctx context.Context, sandboxID string, conn net.Conn)
	// Records returns up to limit of a sandbox's newest egress records.
	Records(sandboxID string, limit int) []api.EgressRecord
}

// Paths of the interception CA inside a sandbox: the CA alone, and a bundle
// of the image's system roots plus the CA that the usual environment
// variables point at.
const (
	sandboxCAFile     = "/etc/ssl/agentbox-ca.pem"
	sandboxBundleFile = "/etc/ssl/agentbox-bundle.pem"
	systemBundleFile  = "/etc/ssl/certs/ca-certificates.crt"
)

// Config configures a Network.
type Config struct {
	// Edge is the egress proxy; nil: mode "egress" is refused (only mode
	// "none" without rules is accepted).
	Edge NetworkEdge
	// Tunnels carries the proxy's connections out of the sandboxes.
	Tunnels *tunnel.Tunnels
	Logger  *slog.Logger
}

// Network is the extension: register it in sandbox.Config.Extensions
// after Tunnels. Its methods are safe for concurrent use; its fields
// never change after New.
type Network struct {
	edge NetworkEdge
	tun  *tunnel.Tunnels
	log  *slog.Logger
	core sandbox.Core // set by Provision, before any hook runs
}

var (
	_ sandbox.Extension   = (*Network)(nil)
	_ sandbox.Provisioner = (*Network)(nil)
	_ sandbox.PrepareHook = (*Network)(nil)
	_ sandbox.CreateHook  = (*Network)(nil)
	_ sandbox.StartHook   = (*Network)(nil)
	_ sandbox.RecoverHook = (*Network)(nil)
	_ sandbox.DeleteHook  = (*Network)(nil)
	_ sandbox.ExecWrapper = (*Network)(nil)
)

// New returns a Network. With an edge, sandboxes in egress mode get a
// proxy listener on api.EgressProxyAddr (through cfg.Tunnels) served by
// it.
func New(cfg Config) *Network {
	n := &Network{edge: cfg.Edge, tun: cfg.Tunnels, log: cfg.Logger}
	if n.edge != nil {
		_, port, _ := net.SplitHostPort(api.EgressProxyAddr)
		var p int
		fmt.Sscan(port, &p)
		n.tun.HandlePortIf(p, egressMode, n.edge.ServeConn)
	}
	return n
}

// Name implements sandbox.Extension.
func (m *Network) Name() string { return "sandboxnet" }

// Provision implements sandbox.Provisioner.
func (m *Network) Provision(c sandbox.Core) error {
	m.core = c
	return nil
}

// PrepareCreate implements sandbox.PrepareHook: it validates the
// request's network spec and normalizes it to what the sandbox records.
func (m *Network) PrepareCreate(ctx context.Context, req *api.CreateSandboxRequest) error {
	ns, err := m.normalizeNetwork(req.Network)
	if err != nil {
		return err
	}
	req.Network = ns
	return nil
}

// OnCreate implements sandbox.CreateHook: the spec is applied at the edge
// and the interception CA installed in the sandbox.
func (m *Network) OnCreate(ctx context.Context, h *sandbox.Handle) error {
	return m.networkUp(ctx, h, true)
}

// OnStart implements sandbox.StartHook. The egress CA lived in the
// backend's state dir: after a wake or an upgrade the edge is configured
// again and the CA put back into the sandbox. A restored sandbox keeps
// what its checkpoint holds.
func (m *Network) OnStart(ctx context.Context, h *sandbox.Handle, cause string) error {
	if cause == api.CauseCreate || cause == sandbox.StartRestore {
		return nil // OnCreate applies a new sandbox's spec
	}
	if err := m.networkUp(ctx, h, true); err != nil {
		m.log.WarnContext(ctx, "re-applying network policy", "sandbox", h.ID(), "err", err)
	}
	return nil
}

// OnRecover implements sandbox.RecoverHook: the edge forgot every policy
// with the previous daemon.
func (m *Network) OnRecover(ctx context.Context, h *sandbox.Handle) error {
	if err := m.networkUp(ctx, h, false); err != nil {
		m.log.WarnContext(ctx, "re-applying network policy", "sandbox", h.ID(), "err", err)
	}
	return nil
}

// OnDelete implements sandbox.DeleteHook: a deleted sandbox is forgotten
// at the edge.
func (m *Network) OnDelete(ctx context.Context, id string) {
	if m.edge != nil {
		m.edge.Remove(id)
	}
}

// WrapExec implements sandbox.ExecWrapper: in egress mode the proxy and CA
// variables are set, under what the request sets itself.
func (m *Network) WrapExec(ctx context.Context, h *sandbox.Handle, req *api.ExecRequest) (sandbox.ExecRun, error) {
	sb := h.Sandbox()
	if !egressMode(sb) {
		return nil, nil
	}
	env := map[string]string{}
	networkEnv(sb, env)
	if req.Env == nil {
		req.Env = make(map[string]string, len(env))
	}
	for k, v := range env {
		if _, ok := req.Env[k]; !ok {
			req.Env[k] = v
		}
	}
	return nil, nil
}

func egressMode(sb api.Sandbox) bool {
	return sb.Network != nil && sb.Network.Mode == api.NetworkEgress
}

// normalizeNetwork validates spec and returns what the sandbox records:
// nil for the default mode "none" without rules.
func (m *Network) normalizeNetwork(spec *api.NetworkSpec) (*api.NetworkSpec, error) {
	if spec == nil {
		return nil, nil
	}
	s := *spec
	if s.Mode == "" {
		s.Mode = api.NetworkNone
	}
	e := m.edge
	if e == nil {
		if s.Mode != api.NetworkNone || len(s.Allow)+len(s.Deny)+len(s.Credentials) > 0 {
			return nil, fmt.Errorf("network mode %q: this daemon has no egress proxy: %w", s.Mode, errdefs.ErrFailedPrecondition)
		}
		return nil, nil
	}
	if err := e.Validate(s); err != nil {
		return nil, err
	}
	s.Allow, s.Deny = slices.Clone(s.Allow), slices.Clone(s.Deny)
	s.Credentials = slices.Clone(s.Credentials)
	return &s, nil
}

// networkUp applies h's recorded network spec at the edge; with install
// it also puts the interception CA into the sandbox's trust store.
func (m *Network) networkUp(ctx context.Context, h *sandbox.Handle, install bool) error {
	e := m.edge
	sb := h.Sandbox()
	if e == nil || sb.Network == nil {
		return nil
	}
	caPEM, err := e.Configure(sb.ID, h.StateDir(), *sb.Network)
	if err != nil {
		return fmt.Errorf("applying network policy: %w", err)
	}
	if install && egressMode(sb) {
		if err := installCA(ctx, h.Guest(), caPEM); err != nil {
			return fmt.Errorf("installing egress CA: %w", err)
		}
	}
	m.tun.Refresh(sb.ID)
	return nil
}

// installCA writes the CA and a bundle of the system roots plus the CA
// into the sandbox (through its guest, as every file operation), and
// appends the CA to the system bundle when the image has one.
func installCA(ctx context.Context, g *client.Client, caPEM []byte) error {
	if g == nil {
		return fmt.Errorf("the sandbox has no guest: %w", errdefs.ErrFailedPrecondition)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var system []byte
	if rc, _, err := g.ReadFile(ctx, systemBundleFile); err == nil {
		system, err = io.ReadAll(io.LimitReader(rc, 16<<20))
		rc.Close()
		if err != nil {
			return err
		}
	}
	if _, err := g.WriteFile(ctx, sandboxCAFile, 0o644, true, bytes.NewReader(caPEM)); err != nil {
		return err
	}
	bundle := append(append(slices.Clone(system), '\n'), caPEM...)
	if _, err := g.WriteFile(ctx, sandboxBundleFile, 0o644, true, bytes.NewReader(bundle)); err != nil {
		return err
	}
	if system != nil && !bytes.Contains(system, caPEM) {
		if _, err := g.WriteFile(ctx, systemBundleFile, 0o644, false, bytes.NewReader(bundle)); err != nil {
			return err
		}
	}
	return nil
}

// networkEnv adds the proxy and CA variables of egress mode to env.
func networkEnv(sb api.Sandbox, env map[string]string) {
	if !egressMode(sb) {
		return
	}
	proxy := "http://" + api.EgressProxyAddr
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		env[k] = proxy
	}
	env["NO_PROXY"] = "localhost,127.0.0.1"
	env["no_proxy"] = "localhost,127.0.0.1"
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"} {
		env[k] = sandboxBundleFile
	}
	env["NODE_EXTRA_CA_CERTS"] = sandboxCAFile
}

// UpdateNetwork replaces a sandbox's network mode and policy at runtime.
func (m *Network) UpdateNetwork(ctx context.Context, id string, spec api.NetworkSpec) (api.Sandbox, error) {
	h, release, err := m.core.Acquire(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	ns, err := m.normalizeNetwork(&spec)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	if err := h.Update(ctx, func(sb *api.Sandbox) { sb.Network = ns }); err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	if ns == nil {
		if m.edge != nil {
			m.edge.Remove(id)
		}
		m.tun.Refresh(id)
		return h.Sandbox(), nil
	}
	if err := m.networkUp(ctx, h, true); err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	return h.Sandbox(), nil
}

// EgressLog returns up to limit of a sandbox's newest egress records,
// oldest first.
func (m *Network) EgressLog(ctx context.Context, id string, limit int) ([]api.EgressRecord, error) {
	if _, err := m.core.Handle(ctx, id); err != nil {
		return nil, err
	}
	e := m.edge
	if e == nil {
		return []api.EgressRecord{}, nil
	}
	recs := e.Records(id, limit)
	if recs == nil {
		recs = []api.EgressRecord{}
	}
	return recs, nil
}
