package serviceurl

import (
	"fmt"
	"net"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Target is one port inside one sandbox.
type Target struct {
	Sandbox string
	Port    int
}

// ParsePort parses a port number in its one canonical spelling: 1 to
// 65535 in decimal digits, no sign, no leading zero, no space, no base
// prefix ("080", "+80", "0x50", " 80" and "80 " are all refused). Every
// place that reads a port from a URL goes through it, so a port has one
// spelling and one meaning.
func ParsePort(s string) (int, error) {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0, fmt.Errorf("port %q is not a canonical port number: %w", clip(s), errdefs.ErrInvalidArgument)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port %q is not a canonical port number: %w", clip(s), errdefs.ErrInvalidArgument)
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, fmt.Errorf("port %d is out of range: %w", n, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// idLen is the length of a sandbox id (internal/sandbox's newID).
const idLen = 12

// ValidSandboxID reports whether s has the shape of a sandbox id: 12
// lower-case letters and digits. Service URLs name sandboxes by id only
// (never by name), so an address means one sandbox for its whole life.
func ValidSandboxID(s string) bool {
	if len(s) != idLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// PathPrefix is the start of every path-based service address:
// /v1/sandboxes/{id}/ports/{port}/{rest}.
const PathPrefix = "/v1/sandboxes/"

// IsServicePath reports whether escapedPath is in the path space of
// service addresses (/v1/sandboxes/*/ports/...), whether or not it parses:
// such a request is a service request, answered by the gateway, never by
// the API.
func IsServicePath(escapedPath string) bool {
	rest, ok := strings.CutPrefix(escapedPath, PathPrefix)
	if !ok {
		return false
	}
	_, after, ok := strings.Cut(rest, "/")
	return ok && (after == "ports" || strings.HasPrefix(after, "ports/"))
}

// ParsePath parses a path-based service address (the request's escaped
// path): the sandbox id, the canonical port, and the escaped path the
// service sees ("/" and up; rest keeps its escaping).
func ParsePath(escapedPath string) (t Target, rest string, err error) {
	bad := fmt.Errorf("not a service address: %w", errdefs.ErrInvalidArgument)
	after, ok := strings.CutPrefix(escapedPath, PathPrefix)
	if !ok {
		return Target{}, "", bad
	}
	id, after, ok := strings.Cut(after, "/")
	if !ok || !ValidSandboxID(id) {
		return Target{}, "", bad
	}
	after, ok = strings.CutPrefix(after, "ports/")
	if !ok {
		return Target{}, "", bad
	}
	portStr, rest, hasRest := strings.Cut(after, "/")
	port, err := ParsePort(portStr)
	if err != nil {
		return Target{}, "", err
	}
	if !hasRest {
		rest = ""
	}
	return Target{Sandbox: id, Port: port}, "/" + rest, nil
}

// PathOf is the path-based address of t, ending in "/".
func PathOf(t Target) string {
	return fmt.Sprintf("%s%s/ports/%d/", PathPrefix, t.Sandbox, t.Port)
}

// ParseHost parses a host-based service address, "{port}-{id}.{domain}"
// with an optional ":port" of the listener, against domain (a host name,
// compared without case). ok is false when host is not under domain at
// all (not a service request); err is set when it is, but does not name a
// target canonically.
func ParseHost(host, domain string) (t Target, ok bool, err error) {
	if domain == "" {
		return Target{}, false, nil
	}
	h := host
	if hst, _, serr := net.SplitHostPort(host); serr == nil {
		h = hst
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	label, found := strings.CutSuffix(h, "."+strings.ToLower(domain))
	if !found {
		return Target{}, false, nil
	}
	portStr, id, found := strings.Cut(label, "-")
	if !found || strings.Contains(label, ".") || !ValidSandboxID(id) {
		return Target{}, true, fmt.Errorf("not a service host: %w", errdefs.ErrInvalidArgument)
	}
	port, err := ParsePort(portStr)
	if err != nil {
		return Target{}, true, err
	}
	return Target{Sandbox: id, Port: port}, true, nil
}

// HostOf is the host-based address of t under domain (which may carry a
// ":port").
func HostOf(t Target, domain string) string {
	return fmt.Sprintf("%d-%s.%s", t.Port, t.Sandbox, domain)
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 16 {
		return s[:16] + "..."
	}
	return s
}
