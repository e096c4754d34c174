package api

import "time"

// Network modes of a sandbox.
const (
	// NetworkNone: loopback only (the default).
	NetworkNone = "none"
	// NetworkEgress: outbound connections only through the host-side
	// egress proxy (HTTP_PROXY=http://127.0.0.1:3128 inside), under the
	// sandbox's policy.
	NetworkEgress = "egress"
)

// EgressProxyAddr is the address of the egress proxy inside a sandbox in
// egress mode.
const EgressProxyAddr = "127.0.0.1:3128"

// HostAlias is the name under which a sandbox in egress mode reaches the
// host's own loopback (127.0.0.1) through the proxy: inside, 127.0.0.1 and
// localhost are the sandbox's own loopback (and in NO_PROXY). It is
// allowed like any name (an Allow entry "host.agentbox.internal:8080"),
// and the address it resolves to is internal, so the daemon must permit
// it too (--egress-permit 127.0.0.1:8080).
const HostAlias = "host.agentbox.internal"

// NetworkSpec is a sandbox's network mode and egress policy.
//
// Allow and Deny entries are "HOST", "HOST:PORT" or "HOST:*" where HOST is
// an exact name ("api.github.com"), a wildcard ("*.example.com": any name
// below example.com, not example.com itself), an IP address ("10.0.0.5",
// "[fd00::1]") or a CIDR ("10.0.0.0/8"). An Allow entry without a port
// allows ports 80 and 443; a Deny entry without a port denies every port.
// Nothing is allowed unless an Allow entry matches, and a matching Deny
// entry always wins.
type NetworkSpec struct {
	Mode        string           `json:"mode"` // "none" (default) or "egress"
	Allow       []string         `json:"allow,omitempty"`
	Deny        []string         `json:"deny,omitempty"`
	Credentials []CredentialRule `json:"credentials,omitempty"`
}

// CredentialRule makes the egress proxy attach a stored secret to HTTPS
// requests to one destination. The sandbox never sees the value: the proxy
// terminates TLS for that destination with the sandbox's own CA and sets
// Header to Format with "{secret}" replaced by the value, after removing any
// client-supplied value of Header. Inside, the placeholder
// "agentbox:secret:NAME" may be used in any header sent to the destination
// and is replaced there too. The destination is allowed implicitly (a Deny
// entry still wins).
type CredentialRule struct {
	Secret     string   `json:"secret"`                // name of the stored secret
	Host       string   `json:"host"`                  // exact host name
	Port       int      `json:"port,omitempty"`        // default 443
	Header     string   `json:"header,omitempty"`      // default "Authorization"
	Format     string   `json:"format,omitempty"`      // default "Bearer {secret}"
	Methods    []string `json:"methods,omitempty"`     // default: every method
	PathPrefix string   `json:"path_prefix,omitempty"` // default: every path
}

// SecretPlaceholder is the text a sandbox uses in place of secret NAME in
// headers sent through the egress proxy: SecretPlaceholder + NAME.
const SecretPlaceholder = "agentbox:secret:"

// Egress decisions.
const (
	EgressAllowed = "allowed"
	EgressDenied  = "denied"
	EgressError   = "error"
)

// EgressRecord is one connection or one intercepted request through a
// sandbox's egress proxy. Injected credentials are named, never shown.
type EgressRecord struct {
	Time        time.Time `json:"time"`
	SandboxID   string    `json:"sandbox_id"`
	RunID       string    `json:"run_id,omitempty"`
	Kind        string    `json:"kind"`        // "connect", "http" (plain proxy request), "request" (intercepted)
	Destination string    `json:"destination"` // host:port as asked
	Address     string    `json:"address,omitempty"`
	Method      string    `json:"method,omitempty"`
	Path        string    `json:"path,omitempty"`
	Status      int       `json:"status,omitempty"`
	Decision    string    `json:"decision"`
	Rule        string    `json:"rule,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	BytesUp     int64     `json:"bytes_up"`
	BytesDown   int64     `json:"bytes_down"`
	Credentials []string  `json:"credentials,omitempty"`
}

// EgressLog is the body of GET /v1/sandboxes/{id}/egress.
type EgressLog struct {
	Records []EgressRecord `json:"records"`
}
