package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// NetworkEdge is the host-side egress proxy a Manager applies sandboxes'
// network policies to (implemented by *egress.Proxy). Connections reach it
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

// SetNetworkEdge makes egress mode available: sandboxes in that mode get a
// proxy listener on api.EgressProxyAddr served by e. Call it before Recover.
func (m *Manager) SetNetworkEdge(e NetworkEdge) {
	m.tun.mu.Lock()
	m.tun.edge = e
	m.tun.mu.Unlock()
	_, port, _ := net.SplitHostPort(api.EgressProxyAddr)
	var p int
	fmt.Sscan(port, &p)
	m.HandleTunnelPortIf(p, egressMode, e.ServeConn)
}

func (m *Manager) networkEdge() NetworkEdge {
	m.tun.mu.Lock()
	defer m.tun.mu.Unlock()
	return m.tun.edge
}

func egressMode(sb api.Sandbox) bool {
	return sb.Network != nil && sb.Network.Mode == api.NetworkEgress
}

// normalizeNetwork validates spec and returns what the sandbox records:
// nil for the default mode "none" without rules.
func (m *Manager) normalizeNetwork(spec *api.NetworkSpec) (*api.NetworkSpec, error) {
	if spec == nil {
		return nil, nil
	}
	s := *spec
	if s.Mode == "" {
		s.Mode = api.NetworkNone
	}
	e := m.networkEdge()
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

// networkUp applies b's recorded network spec at the edge; with install
// it also puts the interception CA into the sandbox's trust store.
func (m *Manager) networkUp(ctx context.Context, b *box, install bool) error {
	e := m.networkEdge()
	sb := b.view()
	if e == nil || sb.Network == nil {
		return nil
	}
	caPEM, err := e.Configure(sb.ID, m.paths(sb.ID).state, *sb.Network)
	if err != nil {
		return fmt.Errorf("applying network policy: %w", err)
	}
	if install && egressMode(sb) {
		if err := m.installCA(ctx, b, caPEM); err != nil {
			return fmt.Errorf("installing egress CA: %w", err)
		}
	}
	m.refreshTunnel(sb.ID)
	return nil
}

// installCA writes the CA and a bundle of the system roots plus the CA
// into the sandbox (through its guest, as every file operation), and
// appends the CA to the system bundle when the image has one.
func (m *Manager) installCA(ctx context.Context, b *box, caPEM []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var system []byte
	if rc, _, err := b.guest.ReadFile(ctx, systemBundleFile); err == nil {
		system, err = io.ReadAll(io.LimitReader(rc, 16<<20))
		rc.Close()
		if err != nil {
			return err
		}
	}
	if _, err := b.guest.WriteFile(ctx, sandboxCAFile, 0o644, true, bytes.NewReader(caPEM)); err != nil {
		return err
	}
	bundle := append(append(slices.Clone(system), '\n'), caPEM...)
	if _, err := b.guest.WriteFile(ctx, sandboxBundleFile, 0o644, true, bytes.NewReader(bundle)); err != nil {
		return err
	}
	if system != nil && !bytes.Contains(system, caPEM) {
		if _, err := b.guest.WriteFile(ctx, systemBundleFile, 0o644, false, bytes.NewReader(bundle)); err != nil {
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
func (m *Manager) UpdateNetwork(ctx context.Context, id string, spec api.NetworkSpec) (api.Sandbox, error) {
	b, release, err := m.acquire(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	ns, err := m.normalizeNetwork(&spec)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	b.mu.Lock()
	b.rec.Sandbox.Network = ns
	b.rec.UpdatedAt = time.Now().UTC()
	rec := b.rec
	b.mu.Unlock()
	if err := m.store.PutSandbox(ctx, rec); err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: saving record: %w", id, err)
	}
	if ns == nil {
		if e := m.networkEdge(); e != nil {
			e.Remove(id)
		}
		m.refreshTunnel(id)
		return b.view(), nil
	}
	if err := m.networkUp(ctx, b, true); err != nil {
		return api.Sandbox{}, fmt.Errorf("updating network of sandbox %s: %w", id, err)
	}
	return b.view(), nil
}

// EgressLog returns up to limit of a sandbox's newest egress records,
// oldest first.
func (m *Manager) EgressLog(ctx context.Context, id string, limit int) ([]api.EgressRecord, error) {
	if _, err := m.get(ctx, id); err != nil {
		return nil, err
	}
	e := m.networkEdge()
	if e == nil {
		return []api.EgressRecord{}, nil
	}
	recs := e.Records(id, limit)
	if recs == nil {
		recs = []api.EgressRecord{}
	}
	return recs, nil
}

// networkDown forgets a deleted sandbox at the edge.
func (m *Manager) networkDown(id string) {
	if e := m.networkEdge(); e != nil {
		e.Remove(id)
	}
}
