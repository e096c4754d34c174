package daemon

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// setupEgress builds the egress proxy of network mode "egress" (see
// sandboxnet). Credentials come from secrets (the encrypted store); runOf
// attributes connections to runs.
func setupEgress(cfg *config.Config, runOf func(ctx context.Context, sandboxID string) string, secrets egress.SecretSource, onRecord func(api.EgressRecord), log *slog.Logger) (*egress.Proxy, error) {
	ecfg := egress.Config{Secrets: secrets, Logger: log, RunOf: runOf, OnRecord: onRecord}
	hosts := hostsResolver{}
	if cfg.EgressHostsFile != "" {
		var err error
		if hosts, err = loadHosts(cfg.EgressHostsFile); err != nil {
			return nil, err
		}
	}
	// The host's loopback, as a sandbox names it (api.HostAlias); the
	// permit rules still decide whether it may be dialled. A hosts file
	// may name it otherwise.
	if _, ok := hosts[api.HostAlias]; !ok {
		hosts[api.HostAlias] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	ecfg.Resolver = hosts
	if cfg.EgressCAFile != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		b, err := os.ReadFile(cfg.EgressCAFile)
		if err != nil {
			return nil, fmt.Errorf("reading egress CA file: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("egress CA file %s holds no certificate: %w", cfg.EgressCAFile, errdefs.ErrInvalidArgument)
		}
		ecfg.RootCAs = pool
	}
	permit, err := cfg.EgressPermitRules()
	if err != nil {
		return nil, err
	}
	ecfg.Permit = permit
	if port, ok := cfg.TCPPort(); ok {
		ecfg.SelfPorts = append(ecfg.SelfPorts, port)
	}
	if port, ok := cfg.MetricsPort(); ok {
		ecfg.SelfPorts = append(ecfg.SelfPorts, port)
	}
	return egress.New(ecfg), nil
}

// hostsResolver resolves the names of a hosts file (and api.HostAlias),
// then falls back to DNS.
type hostsResolver map[string][]netip.Addr

func (h hostsResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := h[host]; ok {
		return a, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

func loadHosts(path string) (hostsResolver, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading egress hosts file: %w", err)
	}
	defer f.Close()
	h := hostsResolver{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil {
			return nil, fmt.Errorf("egress hosts file: %q: %v: %w", fields[0], err, errdefs.ErrInvalidArgument)
		}
		for _, n := range fields[1:] {
			c, err := egress.CanonicalHost(n)
			if err != nil {
				return nil, fmt.Errorf("egress hosts file: %q: %v: %w", n, err, errdefs.ErrInvalidArgument)
			}
			h[c] = append(h[c], a)
		}
	}
	return h, sc.Err()
}
