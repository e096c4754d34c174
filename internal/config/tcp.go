package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Environment variables of the TCP listener's settings (see TCPEdge).
const (
	EnvTLSCert     = "AGENTBOX_TLS_CERT"
	EnvTLSKey      = "AGENTBOX_TLS_KEY"
	EnvInsecureTCP = "AGENTBOX_INSECURE_TCP"
	EnvE2BAddr     = "AGENTBOX_E2B"
)

// Defaults of the TCP listener's request rate per principal.
const (
	DefaultTCPRequestRate  = 100
	DefaultTCPRequestBurst = 200
)

// TCPEdge are the defences of the TCP listener (Config.TCPAddr); the unix
// socket needs none of them. Config embeds it.
type TCPEdge struct {
	// TLSCertFile and TLSKeyFile are a PEM certificate (chain) and its
	// key; when set, the TCP listener speaks only TLS (1.2 or later).
	TLSCertFile string `json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `json:"tls_key_file,omitempty"`
	// InsecureTCP allows serving the API without TLS on an address other
	// than loopback, where API keys would cross the network in clear text.
	InsecureTCP bool `json:"insecure_tcp,omitempty"`
	// MaxConns bounds the TCP listener's connections; 0 derives it from
	// the open-file limit, keeping a reserve for the unix socket, the
	// sandboxes and the store (connlimit.DefaultLimits).
	MaxConns int `json:"max_conns,omitempty"`
	// MaxConnsPerAddr bounds the connections of one client address; 0
	// derives it like MaxConns.
	MaxConnsPerAddr int `json:"max_conns_per_addr,omitempty"`
	// TCPRequestRate is the average number of requests per second each
	// authenticated principal (a tenant, or the admin keys) may make on
	// TCP, with bursts of TCPRequestBurst; over it requests are answered
	// 429 with Retry-After. 0 means no limit.
	TCPRequestRate  float64 `json:"tcp_request_rate,omitempty"`
	TCPRequestBurst int     `json:"tcp_request_burst,omitempty"`

	// E2BAddr is host:port of the E2B-compatible API (internal/e2b,
	// docs/E2B.md); empty = off. It has the TCP listener's defences
	// (TLS with TLSCertFile, connection caps, request rate) and is
	// authenticated by the same API keys (X-API-KEY).
	E2BAddr string `json:"e2b_addr,omitempty"`
	// E2BTemplates map E2B template names to agentbox templates
	// ("base=debian"), over the defaults (e2b.DefaultTemplates).
	E2BTemplates []string `json:"e2b_templates,omitempty"`
}

// TLS reports whether the TCP listener is configured to speak TLS.
func (e *TCPEdge) TLS() bool { return e.TLSCertFile != "" }

func (c *Config) validateTCP() []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("--tls-cert and --tls-key go together")
	}
	for _, p := range []string{c.TLSCertFile, c.TLSKeyFile} {
		if p != "" && !filepath.IsAbs(p) {
			bad("TLS file %q must be an absolute path", p)
		}
	}
	if c.TCPAddr != "" && !c.TLS() && !c.InsecureTCP && !loopbackAddr(c.TCPAddr) {
		bad("tcp address %q is not a loopback address: API keys would cross the network in clear text; give --tls-cert and --tls-key, or --insecure-tcp to accept that", c.TCPAddr)
	}
	if c.E2BAddr != "" {
		if _, ok := portOf(c.E2BAddr); !ok {
			bad("e2b address %q must be host:port", c.E2BAddr)
		} else if !c.TLS() && !c.InsecureTCP && !loopbackAddr(c.E2BAddr) {
			bad("e2b address %q is not a loopback address: API keys would cross the network in clear text; give --tls-cert and --tls-key, or --insecure-tcp to accept that", c.E2BAddr)
		}
	}
	for _, m := range c.E2BTemplates {
		if k, v, ok := strings.Cut(m, "="); !ok || strings.TrimSpace(k) == "" || strings.TrimSpace(v) == "" {
			bad("e2b template mapping %q: want E2BNAME=TEMPLATE", m)
		}
	}
	if c.MaxConns < 0 || c.MaxConnsPerAddr < 0 {
		bad("connection limits must not be negative (max conns %d, per address %d)", c.MaxConns, c.MaxConnsPerAddr)
	}
	if c.TCPRequestRate < 0 || c.TCPRequestBurst < 0 {
		bad("request rate %v and burst %d must not be negative", c.TCPRequestRate, c.TCPRequestBurst)
	}
	return errs
}

// loopbackAddr reports whether host:port names only loopback: "localhost"
// or a loopback IP. An empty host (every interface) is not.
func loopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
