package egress

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The internal-address guard. Loopback, link-local (the cloud metadata
// address among them), private, CGNAT, ULA, unspecified, multicast,
// documentation and translation ranges (internalRanges), the host's own
// interface addresses and the daemon's own listeners are never dialled
// unless the daemon's configuration permits them (Config.Permit); no
// sandbox rule lifts the ban. Allow rules that name such addresses are
// refused when a policy is set (Proxy.Validate), and every address is
// checked again when it is resolved and when the socket connects.

// internalRanges are the address ranges the proxy never dials unless the
// daemon permits them.
var internalRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/96", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001:db8::/32",
		"2002::/16", "fc00::/7", "fe80::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// internalAddr reports whether addr (IPv4-mapped forms included) lies in
// an internal range.
func internalAddr(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range internalRanges {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// ParsePermit parses one entry of the daemon's egress permit list: "CIDR",
// "ADDR", "CIDR:PORT", "CIDR:*" or "[V6CIDR]:PORT" (no port: every port).
// Errors wrap errdefs.ErrInvalidArgument.
func ParsePermit(s string) (*Rule, error) {
	r, err := parseRule(s, false)
	if err != nil {
		return nil, err
	}
	if !r.Prefix.IsValid() {
		return nil, fmt.Errorf("egress permit %q: must be an address or CIDR range: %w", s, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// permits reports whether the daemon's configuration permits dialling
// addr:port.
func (p *Proxy) permits(addr netip.Addr, port int) bool {
	for _, r := range p.cfg.Permit {
		if r.Prefix.Contains(addr) && r.matchPort(port) {
			return true
		}
	}
	return false
}

// forbidden returns why the proxy must not dial addr:port, or "" when it
// may. It is the one check of every resolved address and of every
// address a socket connects to.
func (p *Proxy) forbidden(addr netip.Addr, port int) string {
	addr = addr.Unmap()
	local := addr.IsLoopback() || addr.IsUnspecified() || p.hostAddrs.has(addr)
	for _, sp := range p.cfg.SelfPorts {
		if sp == port && local {
			return "the daemon's own listener"
		}
	}
	switch {
	case !internalAddr(addr) && !p.hostAddrs.has(addr):
		return ""
	case p.permits(addr, port):
		return ""
	case p.hostAddrs.has(addr):
		return "an address of the host"
	default:
		return "an internal address"
	}
}

// validateInternal refuses allow rules that name internal addresses the
// daemon does not permit (for every port the rule covers), and names that
// are loopback by definition (localhost, *.localhost).
func (p *Proxy) validateInternal(pol *Policy) error {
	for _, r := range pol.Allow {
		if err := p.validateRule(r); err != nil {
			return err
		}
	}
	return nil
}

func (p *Proxy) validateRule(r *Rule) error {
	bad := func(what string) error {
		return fmt.Errorf("network rule %q names %s, which sandboxes may not reach unless the daemon's egress permit list allows it: %w", r.Text, what, errdefs.ErrInvalidArgument)
	}
	name := r.Host
	if r.Suffix != "" {
		name = r.Suffix[1:]
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return bad("localhost")
	}
	if !r.Prefix.IsValid() {
		return nil
	}
	for _, in := range internalRanges {
		if !in.Overlaps(r.Prefix) {
			continue
		}
		// Prefixes overlap only by nesting: the overlap is the longer one.
		part := r.Prefix
		if in.Bits() > part.Bits() {
			part = in
		}
		if !p.permitsPrefix(part, r) {
			return bad("internal addresses (" + part.String() + ")")
		}
	}
	return nil
}

// permitsPrefix reports whether one permit entry covers every address of
// part on every port rule r allows.
func (p *Proxy) permitsPrefix(part netip.Prefix, r *Rule) bool {
	for _, pm := range p.cfg.Permit {
		if pm.Prefix.Bits() > part.Bits() || !pm.Prefix.Contains(part.Addr()) {
			continue
		}
		if pm.AnyPort {
			return true
		}
		if r.AnyPort {
			continue
		}
		all := true
		for _, port := range r.Ports {
			all = all && pm.matchPort(port)
		}
		if all {
			return true
		}
	}
	return false
}

// hostAddrCache holds the host's interface addresses, refreshed at most
// every hostAddrTTL.
type hostAddrCache struct {
	// mu guards the fields below.
	mu      sync.Mutex
	addrs   map[netip.Addr]bool
	fetched time.Time
}

const hostAddrTTL = 2 * time.Second

func (c *hostAddrCache) has(a netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.addrs == nil || time.Since(c.fetched) > hostAddrTTL {
		c.addrs = map[netip.Addr]bool{}
		if ifas, err := net.InterfaceAddrs(); err == nil {
			for _, ifa := range ifas {
				if n, ok := ifa.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(n.IP); ok {
						c.addrs[ip.Unmap()] = true
					}
				}
			}
		}
		c.fetched = time.Now()
	}
	return c.addrs[a.Unmap()]
}
