// Package egress is the host-side egress proxy of sandboxes in network mode
// "egress": an HTTP proxy (CONNECT and absolute-form requests) that applies
// each sandbox's domain policy, refuses internal addresses, dials exactly
// the address it checked, terminates TLS for destinations that carry an
// injected credential, and records every connection and intercepted
// request.
//
// Connections reach the proxy over the sandbox's reverse tunnel
// (internal/guest/tunnel.go), so the proxy knows which sandbox a connection
// comes from without trusting anything the sandbox says.
package egress

import (
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/idna"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/urlpath"
)

// Rule is one parsed allow or deny entry.
type Rule struct {
	Text     string       // as written
	Host     string       // canonical exact name; "" for wildcard and IP rules
	Suffix   string       // wildcard: ".example.com"
	Prefix   netip.Prefix // IP and CIDR rules
	AnyPort  bool
	Ports    []int
	implicit bool // created from a credential rule
}

func (r *Rule) matchPort(port int) bool {
	if r.AnyPort {
		return true
	}
	for _, p := range r.Ports {
		if p == port {
			return true
		}
	}
	return false
}

// matchHost reports whether the rule covers a destination given as a
// canonical name (addr invalid) or as an IP literal (name "").
func (r *Rule) matchHost(name string, addr netip.Addr) bool {
	switch {
	case r.Prefix.IsValid():
		return addr.IsValid() && r.Prefix.Contains(addr)
	case r.Suffix != "":
		return name != "" && strings.HasSuffix(name, r.Suffix)
	default:
		return name != "" && name == r.Host
	}
}

// Policy is a parsed NetworkSpec. It is immutable once built.
type Policy struct {
	Mode        string
	Allow, Deny []*Rule
	Credentials []Credential
}

// Credential is a validated api.CredentialRule.
type Credential struct {
	Secret     string
	Host       string // canonical
	Port       int
	Header     string // canonical MIME header key
	Format     string
	Methods    []string
	PathPrefix string // canonical (urlpath.Canonical); matched on segment boundaries
}

// matches reports whether the credential applies to a request with method
// and canonical path (urlpath.Canonical).
func (c *Credential) matches(method, path string) bool {
	if len(c.Methods) > 0 {
		ok := false
		for _, m := range c.Methods {
			if m == method {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return c.PathPrefix == "" || urlpath.HasPrefix(path, c.PathPrefix)
}

const (
	maxRules   = 256
	maxRuleLen = 300
)

var secretNameOK = func(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// ParsePolicy validates and parses spec. Errors wrap
// errdefs.ErrInvalidArgument.
func ParsePolicy(spec api.NetworkSpec) (*Policy, error) {
	p := &Policy{Mode: spec.Mode}
	if p.Mode == "" {
		p.Mode = api.NetworkNone
	}
	if p.Mode != api.NetworkNone && p.Mode != api.NetworkEgress {
		return nil, fmt.Errorf("network mode %q: want %q or %q: %w", spec.Mode, api.NetworkNone, api.NetworkEgress, errdefs.ErrInvalidArgument)
	}
	if len(spec.Allow)+len(spec.Deny)+len(spec.Credentials) > maxRules {
		return nil, fmt.Errorf("at most %d network rules: %w", maxRules, errdefs.ErrInvalidArgument)
	}
	for _, list := range []struct {
		in    []string
		out   *[]*Rule
		allow bool
	}{{spec.Allow, &p.Allow, true}, {spec.Deny, &p.Deny, false}} {
		for _, text := range list.in {
			r, err := parseRule(text, list.allow)
			if err != nil {
				return nil, err
			}
			*list.out = append(*list.out, r)
		}
	}
	for _, cr := range spec.Credentials {
		c, err := parseCredential(cr)
		if err != nil {
			return nil, err
		}
		p.Credentials = append(p.Credentials, c)
		p.Allow = append(p.Allow, &Rule{Text: "credential:" + c.Secret + "@" + net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), Host: c.Host, Ports: []int{c.Port}, implicit: true})
	}
	return p, nil
}

func parseCredential(cr api.CredentialRule) (Credential, error) {
	bad := func(what string) (Credential, error) {
		return Credential{}, fmt.Errorf("credential rule for secret %q: %s: %w", cr.Secret, what, errdefs.ErrInvalidArgument)
	}
	if !secretNameOK(cr.Secret) {
		return bad("secret name is not valid")
	}
	host, err := CanonicalHost(cr.Host)
	if err != nil {
		return bad(err.Error())
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return bad("host must be a name, not an address")
	}
	c := Credential{Secret: cr.Secret, Host: host, Port: cr.Port, Header: cr.Header, Format: cr.Format, PathPrefix: cr.PathPrefix}
	if c.Port == 0 {
		c.Port = 443
	}
	if c.Port < 1 || c.Port > 65535 {
		return bad("port out of range")
	}
	if c.Header == "" {
		c.Header = "Authorization"
	}
	if !validHeaderName(c.Header) {
		return bad("header name is not valid")
	}
	c.Header = canonicalHeader(c.Header)
	if c.Format == "" {
		c.Format = "Bearer {secret}"
	}
	if !strings.Contains(c.Format, "{secret}") || strings.ContainsAny(c.Format, "\r\n\x00") || len(c.Format) > 1024 {
		return bad("format must contain {secret} and no line breaks")
	}
	for _, m := range cr.Methods {
		if m == "" || strings.ToUpper(m) != m || !validHeaderName(m) {
			return bad("method " + strconv.Quote(m) + " is not valid")
		}
		c.Methods = append(c.Methods, m)
	}
	if c.PathPrefix != "" {
		canon, err := urlpath.Canonical(c.PathPrefix)
		if err != nil {
			return bad("path_prefix must be an absolute path without encoded slashes, backslashes, dot or empty segments")
		}
		c.PathPrefix = canon
	}
	return c, nil
}

func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// parseRule parses "HOST", "HOST:PORT", "HOST:*", "[V6]:PORT", "CIDR",
// "CIDR:PORT".
func parseRule(text string, allow bool) (*Rule, error) {
	bad := func(why string) (*Rule, error) {
		return nil, fmt.Errorf("network rule %q: %s: %w", text, why, errdefs.ErrInvalidArgument)
	}
	if text == "" || len(text) > maxRuleLen {
		return bad("empty or too long")
	}
	host, portText := text, ""
	if strings.HasPrefix(text, "[") {
		end := strings.Index(text, "]")
		if end < 0 {
			return bad("unclosed [")
		}
		host, portText = text[1:end], strings.TrimPrefix(text[end+1:], ":")
		if text[end+1:] != "" && !strings.HasPrefix(text[end+1:], ":") {
			return bad("junk after ]")
		}
	} else if i := strings.LastIndex(text, ":"); i >= 0 && strings.Count(text, ":") == 1 {
		host, portText = text[:i], text[i+1:]
	}
	r := &Rule{Text: text}
	switch {
	case portText == "*":
		r.AnyPort = true
	case portText != "":
		port, err := strconv.Atoi(portText)
		if err != nil || port < 1 || port > 65535 {
			return bad("port is not valid")
		}
		r.Ports = []int{port}
	case allow:
		r.Ports = []int{80, 443}
	default:
		r.AnyPort = true
	}
	if pfx, err := netip.ParsePrefix(host); err == nil {
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		addr = addr.Unmap()
		r.Prefix = netip.PrefixFrom(addr, addr.BitLen())
		return r, nil
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		c, err := CanonicalHost(rest)
		if err != nil {
			return bad(err.Error())
		}
		if _, err := netip.ParseAddr(c); err == nil {
			return bad("wildcard of an address")
		}
		r.Suffix = "." + c
		return r, nil
	}
	c, err := CanonicalHost(host)
	if err != nil {
		return bad(err.Error())
	}
	r.Host = c
	return r, nil
}

// CanonicalHost lower-cases name, strips one trailing dot and converts it
// to its IDNA ASCII form. IP literals (in canonical form, IPv6 without
// brackets) are returned as netip formats them. Names that look like a
// numeric address in a non-canonical form ("2130706433", "0x7f.1",
// "0177.0.0.1", "127.1") are refused: resolvers disagree on them.
func CanonicalHost(name string) (string, error) {
	if name == "" || len(name) > 253+1 {
		return "", fmt.Errorf("empty or too long host name")
	}
	if addr, err := netip.ParseAddr(name); err == nil {
		if addr.Zone() != "" {
			return "", fmt.Errorf("zoned address")
		}
		return addr.Unmap().String(), nil
	}
	name = strings.TrimSuffix(name, ".")
	a, err := idna.Lookup.ToASCII(strings.ToLower(name))
	if err != nil {
		return "", fmt.Errorf("host name is not valid: %v", err)
	}
	a = strings.ToLower(a)
	if a == "" || strings.HasSuffix(a, ".") {
		return "", fmt.Errorf("host name is not valid")
	}
	labels := strings.Split(a, ".")
	if numericLabel(labels[len(labels)-1]) {
		return "", fmt.Errorf("numeric host %q is not an address in canonical form", name)
	}
	return a, nil
}

// numericLabel reports whether s is a decimal, octal or hex number (the
// forms inet_aton accepts as address parts).
func numericLabel(s string) bool {
	if s == "" {
		return false
	}
	if h, ok := strings.CutPrefix(s, "0x"); ok {
		for _, r := range h {
			if !strings.ContainsRune("0123456789abcdef", r) {
				return false
			}
		}
		return true
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func canonicalHeader(h string) string {
	return textproto.CanonicalMIMEHeaderKey(h)
}

// Decision is the outcome of checking a destination against a policy.
type Decision struct {
	Allowed bool
	Rule    string // the rule that decided; "" for the default deny
	Reason  string
}

// checkDest applies the allow and deny rules to a canonical destination
// (name or IP literal) and port.
func (p *Policy) checkDest(host string, port int) Decision {
	if p == nil || p.Mode != api.NetworkEgress {
		return Decision{Reason: "network mode is not egress"}
	}
	var addr netip.Addr
	name := host
	if a, err := netip.ParseAddr(host); err == nil {
		addr, name = a, ""
	}
	for _, r := range p.Deny {
		if r.matchHost(name, addr) && r.matchPort(port) {
			return Decision{Rule: "deny " + r.Text, Reason: "denied by rule"}
		}
	}
	for _, r := range p.Allow {
		if r.matchHost(name, addr) && r.matchPort(port) {
			return Decision{Allowed: true, Rule: "allow " + r.Text}
		}
	}
	return Decision{Reason: "no allow rule matches"}
}

// credentialsFor returns the credential rules of a destination.
func (p *Policy) credentialsFor(host string, port int) []Credential {
	var out []Credential
	for _, c := range p.Credentials {
		if c.Host == host && c.Port == port {
			out = append(out, c)
		}
	}
	return out
}
