// Package config holds the daemon's one typed configuration: defaults,
// environment variables, the flags of `agentbox serve`, parsing and
// validation. The order of precedence is Default() < ApplyEnv() < flags
// (BindFlags), then Validate(); the daemon reads only a validated Config.
package config

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Environment variables read by ApplyEnv.
const (
	EnvDataDir       = "AGENTBOX_DATA_DIR"
	EnvSocket        = "AGENTBOX_SOCKET"
	EnvTCP           = "AGENTBOX_TCP"
	EnvServiceDomain = "AGENTBOX_SERVICE_DOMAIN"
	EnvPublicURL     = "AGENTBOX_PUBLIC_URL"
	EnvMetricsAddr   = "AGENTBOX_METRICS_ADDR"
	EnvAPIKeysFile   = "AGENTBOX_API_KEYS_FILE"
	EnvLogLevel      = "AGENTBOX_LOG_LEVEL"
	EnvLogFormat     = "AGENTBOX_LOG_FORMAT"
	// EnvSecretsKeyFile and EnvConnectorsFile: see Config.
	EnvSecretsKeyFile = "AGENTBOX_SECRETS_KEY_FILE"
	EnvConnectorsFile = "AGENTBOX_CONNECTORS_FILE"
	// EnvAuditKeyFile and EnvOTLPEndpoint: see Config.
	EnvAuditKeyFile = "AGENTBOX_AUDIT_KEY_FILE"
	EnvOTLPEndpoint = "AGENTBOX_OTLP_ENDPOINT"
	// EnvEgressHostsFile, EnvEgressCAFile and EnvEgressPermit: see Config
	// (the permit list is comma-separated).
	EnvEgressHostsFile = "AGENTBOX_EGRESS_HOSTS_FILE"
	EnvEgressCAFile    = "AGENTBOX_EGRESS_CA_FILE"
	EnvEgressPermit    = "AGENTBOX_EGRESS_PERMIT"
	// EnvStorageDriver and EnvMaxLayerDepth: see Config.
	EnvStorageDriver = "AGENTBOX_STORAGE_DRIVER"
	EnvMaxLayerDepth = "AGENTBOX_MAX_LAYER_DEPTH"
	// EnvImplicitCheckpointsKeep and EnvImplicitCheckpointsMaxAge: see
	// Config.ImplicitCheckpointsKeep.
	EnvImplicitCheckpointsKeep   = "AGENTBOX_IMPLICIT_CHECKPOINTS_KEEP"
	EnvImplicitCheckpointsMaxAge = "AGENTBOX_IMPLICIT_CHECKPOINTS_MAX_AGE_SECONDS"
	// EnvCgroupParent: see Config.CgroupParent.
	EnvCgroupParent = "AGENTBOX_CGROUP_PARENT"
	// EnvPrespawn: see Config.Prespawn.
	EnvPrespawn = "AGENTBOX_PRESPAWN"
	// EnvRuntime: see Config.Runtime.
	EnvRuntime = "AGENTBOX_RUNTIME"
	// EnvRunsc and EnvGvisorPlatform: see Config.Runsc and GvisorPlatform.
	EnvRunsc          = "AGENTBOX_RUNSC"
	EnvGvisorPlatform = "AGENTBOX_GVISOR_PLATFORM"
)

// Defaults.
const (
	DefaultDataDir    = "/var/lib/agentbox"
	DefaultSocketPath = "/run/agentbox/agentbox.sock"
	DefaultSecretsKey = "/etc/agentbox/secrets.key"
	DefaultTemplate   = "busybox"
	DefaultRuntime    = "native" // the backend of sandboxes whose create names none
	DefaultIDMapBase  = 100000
	// DefaultIDMapSize holds 4096 slots of 65536 ids (package idrange):
	// the layers' canonical range and 4095 sandboxes' own ranges.
	DefaultIDMapSize    = 4096 * 65536
	SubIDUser           = "agentbox" // the /etc/subuid and /etc/subgid entry used
	minHostIDForSandbox = 1000       // host ids below this are system accounts
	// DefaultPrespawn guests are kept started: two, so back-to-back
	// creates find one fully warm.
	DefaultPrespawn = 2
	maxPrespawn     = 64
	// Implicit checkpoints (exec --checkpoint, fork, merge) are kept at
	// most ten per sandbox and a day by default.
	DefaultImplicitCheckpointsKeep          = 10
	DefaultImplicitCheckpointsMaxAgeSeconds = 24 * 60 * 60
	maxImplicitCheckpointAge                = 10 * 365 * 24 * 60 * 60
	// The flight recorder keeps a deleted sandbox's record a week and at
	// most 64 MiB of events per sandbox by default.
	DefaultAuditRetentionSeconds = 7 * 24 * 60 * 60
	DefaultAuditMaxBytes         = 64 << 20
	DefaultAuditTrackFrom        = 512
)

// Resources are the default limits of a sandbox that asks for none.
type Resources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	PidsMax     int64   `json:"pids_max"`
	// DiskBytes and DiskInodes: the writable layer's size and inodes
	// (api/limits.go), DefaultDiskBytes and DefaultDiskInodes unless set;
	// DiskBytes 0 turns the default disk limit off (only this config can).
	// OpenFiles: RLIMIT_NOFILE; 0: inherited.
	DiskBytes  int64 `json:"disk_bytes,omitempty"`
	DiskInodes int64 `json:"disk_inodes,omitempty"`
	OpenFiles  int64 `json:"open_files,omitempty"`
}

// The default disk limit of every sandbox: a tenant that asks for none gets
// it, and may ask for less but not more (Config.MaxDiskBytes).
const (
	DefaultDiskBytes  = 10 << 30
	DefaultDiskInodes = 512 << 10
)

// Config is the daemon configuration. Every setting is parsed and checked
// here, never in the daemon: Validate reports every problem at once, and
// values with a richer type than the field's are parsed by a method of
// Config (EgressPermitRules, TCPPort, EffectiveCgroupParent).
//
// To add a setting:
//  1. Add the field here (or to the embedded group it belongs to, such as
//     TCPEdge) with its JSON key and a doc comment saying what it does,
//     its unit and what zero means.
//  2. Give its default in Default() when zero is not it.
//  3. Add a row to settings (settings.go): JSON key, flag of
//     `agentbox serve`, environment variable (an Env constant), help text
//     and the field. That one row defines the flag, the variable and the
//     reference docs/CONFIG.md; a field of a new type needs a case in
//     bindFlag and applyEnvValue.
//  4. Check it in Validate (or the group's validateX), wrapping
//     errdefs.ErrInvalidArgument; parse it in a method of Config when the
//     daemon needs more than the field.
//  5. Pass it from internal/daemon to the package that uses it, as a
//     constructor argument.
//  6. Regenerate docs/CONFIG.md: go test ./internal/config -run
//     TestSettingsDoc -update.
type Config struct {
	// DataDir holds the metadata store, layers, templates and sandboxes.
	DataDir string `json:"data_dir"`
	// SocketPath is the trusted unix socket (0600, root).
	SocketPath string `json:"socket_path"`
	// TCPAddr is host:port of the authenticated TCP listener; empty = off.
	TCPAddr string `json:"tcp_addr,omitempty"`
	// MetricsAddr is host:port of the dedicated metrics listener (GET
	// /metrics, /healthz, /readyz without credentials); empty = off; an
	// empty host (":9464") means 127.0.0.1. See docs/METRICS.md.
	MetricsAddr string `json:"metrics_addr,omitempty"`
	// APIKeysFile holds one API key per line (blank lines and lines starting
	// with # are ignored). Required when TCPAddr is set.
	APIKeysFile string `json:"api_keys_file,omitempty"`
	// APIKeys are the keys loaded by LoadAPIKeys. Never log them: use
	// Redacted.
	APIKeys []string `json:"api_keys,omitempty"`
	// AllowedHosts restricts the Host header on the TCP listener (DNS
	// rebinding defence): "host" or "host:port" entries, "*" for any;
	// empty allows IP literals and localhost only.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
	// TCPEdge are the TCP listener's TLS, connection and rate limits
	// (tcp.go).
	TCPEdge
	// ServiceDomain turns on host-based service URLs,
	// {port}-{id}.{ServiceDomain} on the TCP listener (a wildcard DNS name
	// pointing at it; docs/SERVICE-URLS.md). It may end in ":port", the
	// port clients reach the listener on. Empty: path-based only.
	ServiceDomain string `json:"service_domain,omitempty"`
	// PublicURL is the TCP listener's address as clients reach it
	// (scheme://host[:port]), the base of the service URLs the API
	// returns. Empty: derived from TCPAddr (an unspecified host is
	// 127.0.0.1).
	PublicURL string `json:"public_url,omitempty"`

	// UIDMapBase/UIDMapSize and GIDMapBase/GIDMapSize are the host id ranges
	// sandboxes' user namespaces are mapped into, cut into slots of 65536
	// ids: the first owns every layer on disk, each sandbox runs in one of
	// its own (package idrange). Size must hold at least two slots.
	UIDMapBase uint32 `json:"uid_map_base"`
	UIDMapSize uint32 `json:"uid_map_size"`
	GIDMapBase uint32 `json:"gid_map_base"`
	GIDMapSize uint32 `json:"gid_map_size"`

	// DefaultTemplate is used when a create request names none.
	DefaultTemplate string `json:"default_template"`
	// DefaultResources apply to every zero field of a create request.
	DefaultResources Resources `json:"default_resources"`
	// MaxDiskBytes and MaxDiskInodes are the most disk_bytes and
	// disk_inodes a tenant's sandbox may have (asked for, or from its
	// template); 0: the default's (DefaultResources). The admin's
	// sandboxes are not bound by them.
	MaxDiskBytes  int64 `json:"max_disk_bytes,omitempty"`
	MaxDiskInodes int64 `json:"max_disk_inodes,omitempty"`
	// WarmPools is the number of paused sandboxes kept ready per template
	// and backend, keyed TEMPLATE (the backend a create of the template
	// naming none runs on) or TEMPLATE:RUNTIME (e.g. {"busybox": 2,
	// "busybox:gvisor": 1}); sizes set through the API win (limits.go).
	WarmPools map[string]int `json:"warm_pools,omitempty"`
	// Prespawn is the number of guests the native backend keeps started
	// ahead of need, each in a cgroup and id range of its own, so a create
	// skips the clone, the exec of the runner, its start-up and its move
	// into a cgroup (native.Prespawn; hosts with cgroup v1 controllers,
	// where that move is slow). 0: none.
	Prespawn int `json:"prespawn"`

	// SecretsKeyFile holds the master key of the secret store and of run
	// tokens; it must be outside DataDir. Created (0600) when missing.
	SecretsKeyFile string `json:"secrets_key_file"`
	// AuditKeyFile holds the ed25519 key that signs the flight recorder's
	// chain heads (internal/audit); it must be outside DataDir. Empty:
	// audit.key beside SecretsKeyFile (AuditKey). Created (0600) when
	// missing.
	AuditKeyFile string `json:"audit_key_file,omitempty"`
	// AuditRetentionSeconds is how long a deleted sandbox's record is
	// kept; AuditMaxBytes bounds one sandbox's record (events beyond it
	// are counted in a "dropped" event, not kept). AuditDisabled turns the
	// flight recorder off. AuditWalk makes it list each run's writable
	// layer before and after the run instead of following it with its
	// fanotify change tracker (docs/AUDIT.md: for comparison and as a
	// way out). AuditTrackFrom is the size (entries) from which a
	// writable layer is followed by the change tracker rather than listed
	// per run (a small layer lists faster than the tracker's barrier);
	// 0 tracks every layer.
	AuditRetentionSeconds int   `json:"audit_retention_seconds"`
	AuditMaxBytes         int64 `json:"audit_max_bytes"`
	AuditDisabled         bool  `json:"audit_disabled,omitempty"`
	AuditWalk             bool  `json:"audit_walk,omitempty"`
	AuditTrackFrom        int   `json:"audit_track_from"`
	// ConsoleDisabled stops serving the web console at /ui/ (and with it
	// the same-origin browser requests it makes; docs/CONSOLE.md).
	ConsoleDisabled bool `json:"console_disabled,omitempty"`
	// OTLPEndpoint is the URL of an OpenTelemetry collector's OTLP/HTTP
	// traces endpoint (e.g. http://127.0.0.1:4318/v1/traces) the flight
	// recorder exports its events to as traces (internal/auditotel);
	// empty: no export.
	OTLPEndpoint string `json:"otlp_endpoint,omitempty"`
	// ConnectorsFile is a JSON array of API bridge connectors
	// (internal/bridge.Connector); empty: no connectors.
	ConnectorsFile string `json:"connectors_file,omitempty"`

	// EgressHostsFile is a hosts(5)-style file ("ADDR NAME..." lines) of
	// names the egress proxy resolves without DNS (split horizon, tests).
	EgressHostsFile string `json:"egress_hosts_file,omitempty"`
	// EgressCAFile holds PEM roots the egress proxy trusts for upstream
	// certificates in addition to the system roots.
	EgressCAFile string `json:"egress_ca_file,omitempty"`
	// EgressPermit lists the internal address ranges the egress proxy may
	// dial for sandboxes whose rules allow them ("CIDR" or "ADDR", with an
	// optional ":PORT" or ":*"; see egress.ParsePermit). Internal addresses
	// outside it (loopback, link-local, private, CGNAT, ULA, the host's
	// own addresses) are never dialled, and allow rules naming them are
	// refused, whoever writes them. The daemon's own TCP port is never
	// dialled on a local address.
	EgressPermit []string `json:"egress_permit,omitempty"`

	// StorageDriver is the layer storage driver: "" or "auto" probes the
	// data dir's filesystem (reflink where FICLONE works, else copy);
	// "copy" or "reflink" force one.
	StorageDriver string `json:"storage_driver,omitempty"`
	// MaxLayerDepth bounds layer chains: a checkpoint or template whose
	// chain is deeper is squashed. 0 means 32; overlayfs allows 500.
	MaxLayerDepth int `json:"max_layer_depth,omitempty"`
	// ImplicitCheckpointsKeep is how many of the checkpoints the daemon
	// takes on its own (exec --checkpoint, fork, merge: label
	// agentbox.implicit) are kept per sandbox, newest first; older ones
	// are pruned. ImplicitCheckpointsMaxAgeSeconds prunes them once they
	// are that old. 0 means no limit. A checkpoint a live sandbox runs on
	// or was forked from is never pruned; checkpoints users ask for are
	// never pruned.
	ImplicitCheckpointsKeep          int `json:"implicit_checkpoints_keep"`
	ImplicitCheckpointsMaxAgeSeconds int `json:"implicit_checkpoints_max_age_seconds"`
	// CgroupParent is the cgroup (relative to the hierarchy roots) under
	// which this daemon makes its sandboxes' and prespawned guests'
	// cgroups. The daemon owns it alone: it holds a host-wide lock on it
	// and at start-up removes every cgroup under it that no record
	// claims. Empty means one derived from the data dir
	// (DerivedCgroupParent), so two daemons with different data dirs never
	// share one. Use EffectiveCgroupParent to read it.
	CgroupParent string `json:"cgroup_parent,omitempty"`
	// Runtime names the isolation backend of sandboxes whose create
	// request names none (internal/runtime.Registry; "native"). The daemon
	// refuses to start when it runs no backend of that name.
	Runtime string `json:"runtime,omitempty"`
	// Runsc is the runsc binary of the gvisor backend; empty looks in
	// scripts/install-deps.sh's cache, then on $PATH. Without one the
	// daemon runs without that backend, and a create asking for it is
	// refused saying how to install it.
	Runsc string `json:"runsc,omitempty"`
	// GvisorPlatform is runsc's platform: systrap (the default, empty),
	// ptrace, or kvm (only where /dev/kvm really works).
	GvisorPlatform string `json:"gvisor_platform,omitempty"`
	// CPUYield makes sandboxes that stay CPU-bound yield the CPU to the
	// other sandboxes and, while any does, all sandboxes to the host (see
	// internal/runtime/native/cpuyield.go). Nil means on.
	CPUYield *bool `json:"cpu_yield,omitempty"`

	// LogLevel is debug, info, warn or error. LogFormat is text or json.
	LogLevel  string `json:"log_level"`
	LogFormat string `json:"log_format"`
}

// Default returns the built-in configuration. The id map ranges come from the
// "agentbox" entries of /etc/subuid and /etc/subgid when present.
func Default() *Config {
	c := &Config{
		DataDir:         DefaultDataDir,
		SocketPath:      DefaultSocketPath,
		UIDMapBase:      DefaultIDMapBase,
		UIDMapSize:      DefaultIDMapSize,
		GIDMapBase:      DefaultIDMapBase,
		GIDMapSize:      DefaultIDMapSize,
		DefaultTemplate: DefaultTemplate,
		Runtime:         DefaultRuntime,
		DefaultResources: Resources{
			CPUs:        1,
			MemoryBytes: 1 << 30,
			PidsMax:     1024,
			DiskBytes:   DefaultDiskBytes,
			DiskInodes:  DefaultDiskInodes,
		},
		SecretsKeyFile: DefaultSecretsKey,
		Prespawn:       DefaultPrespawn,

		AuditRetentionSeconds: DefaultAuditRetentionSeconds,
		AuditMaxBytes:         DefaultAuditMaxBytes,
		AuditTrackFrom:        DefaultAuditTrackFrom,

		ImplicitCheckpointsKeep:          DefaultImplicitCheckpointsKeep,
		ImplicitCheckpointsMaxAgeSeconds: DefaultImplicitCheckpointsMaxAgeSeconds,
		TCPEdge:                          TCPEdge{TCPRequestRate: DefaultTCPRequestRate, TCPRequestBurst: DefaultTCPRequestBurst},
		LogLevel:                         "info",
		LogFormat:                        "text",
	}
	if start, size, ok := lookupSubIDFile("/etc/subuid", SubIDUser); ok {
		c.UIDMapBase, c.UIDMapSize = start, size
	}
	if start, size, ok := lookupSubIDFile("/etc/subgid", SubIDUser); ok {
		c.GIDMapBase, c.GIDMapSize = start, size
	}
	return c
}

func lookupSubIDFile(path, user string) (start, size uint32, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	start, size, ok, err = ParseSubID(f, user)
	if err != nil {
		return 0, 0, false
	}
	return start, size, ok
}

// ParseSubID reads an /etc/subuid or /etc/subgid formatted stream
// ("name:start:count" per line) and returns the first range of user. Lines
// that are blank or start with # are skipped; malformed lines of other users
// are ignored, a malformed line of user is an error.
func ParseSubID(r io.Reader, user string) (start, size uint32, ok bool, err error) {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ":")
		if parts[0] != user {
			continue
		}
		if len(parts) != 3 {
			return 0, 0, false, fmt.Errorf("subid line %d: want name:start:count: %w", n, errdefs.ErrInvalidArgument)
		}
		s, err1 := strconv.ParseUint(parts[1], 10, 32)
		c, err2 := strconv.ParseUint(parts[2], 10, 32)
		if err1 != nil || err2 != nil || c == 0 || s+c > 1<<32 {
			return 0, 0, false, fmt.Errorf("subid line %d: bad range %q: %w", n, line, errdefs.ErrInvalidArgument)
		}
		return uint32(s), uint32(c), true, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, false, fmt.Errorf("reading subid file: %w", err)
	}
	return 0, 0, false, nil
}

// Validate reports every problem of c at once, joined, each wrapping
// errdefs.ErrInvalidArgument.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...))
	}
	if !filepath.IsAbs(c.DataDir) {
		bad("data dir %q must be an absolute path", c.DataDir)
	}
	if !filepath.IsAbs(c.SocketPath) {
		bad("socket path %q must be an absolute path", c.SocketPath)
	} else if len(c.SocketPath) > 107 {
		bad("socket path %q is longer than a unix socket address allows (107 bytes)", c.SocketPath)
	}
	if c.TCPAddr != "" {
		if _, ok := c.TCPPort(); !ok {
			bad("tcp address %q must be host:port", c.TCPAddr)
		}
	}
	if c.ServiceDomain != "" && !validServiceDomain(c.ServiceDomain) {
		bad("service domain %q must be a DNS name, optionally with :port", c.ServiceDomain)
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			bad("public URL %q must be http(s)://host[:port]", c.PublicURL)
		}
	}
	if c.MetricsAddr != "" {
		if _, ok := c.MetricsPort(); !ok {
			bad("metrics address %q must be host:port", c.MetricsAddr)
		}
	}
	checkRange := func(kind string, base, size uint32) {
		switch {
		case size < 2*65536:
			bad("%s map size %d must hold at least two slots of 65536 ids (the layers' range and one sandbox's)", kind, size)
		case base < minHostIDForSandbox:
			bad("%s map range %d-%d includes host ids below %d (root and system accounts)", kind, base, uint64(base)+uint64(size)-1, minHostIDForSandbox)
		case uint64(base)+uint64(size) > 1<<32-1:
			bad("%s map range %d+%d overflows 32-bit ids", kind, base, size)
		}
	}
	checkRange("uid", c.UIDMapBase, c.UIDMapSize)
	checkRange("gid", c.GIDMapBase, c.GIDMapSize)
	// One range serves both: a sandbox's uid and gid maps are the same
	// slot of it (package idrange).
	if c.UIDMapBase != c.GIDMapBase || c.UIDMapSize != c.GIDMapSize {
		bad("uid map %d+%d and gid map %d+%d must be the same range",
			c.UIDMapBase, c.UIDMapSize, c.GIDMapBase, c.GIDMapSize)
	}
	if c.DefaultTemplate == "" {
		bad("default template must be set")
	}
	if c.Runsc != "" && !filepath.IsAbs(c.Runsc) {
		bad("runsc %q must be an absolute path", c.Runsc)
	}
	switch c.GvisorPlatform {
	case "", "systrap", "ptrace", "kvm":
	default:
		bad("gvisor platform %q must be systrap, ptrace or kvm", c.GvisorPlatform)
	}
	if c.Runtime != "" && !runtime.ValidName(c.Runtime) {
		bad("runtime %q must be a backend name (lower-case letters, digits and dashes)", c.Runtime)
	}
	if !filepath.IsAbs(c.SecretsKeyFile) {
		bad("secrets key file %q must be an absolute path", c.SecretsKeyFile)
	} else if rel, err := filepath.Rel(c.DataDir, c.SecretsKeyFile); filepath.IsAbs(c.DataDir) && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		bad("secrets key file %q must be outside the data dir", c.SecretsKeyFile)
	}
	if k := c.AuditKey(); !filepath.IsAbs(k) {
		bad("audit key file %q must be an absolute path", k)
	} else if rel, err := filepath.Rel(c.DataDir, k); filepath.IsAbs(c.DataDir) && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		bad("audit key file %q must be outside the data dir", k)
	}
	if c.AuditRetentionSeconds < 0 || c.AuditRetentionSeconds > maxImplicitCheckpointAge {
		bad("audit_retention_seconds %d must be between 0 (default) and %d", c.AuditRetentionSeconds, maxImplicitCheckpointAge)
	}
	if c.OTLPEndpoint != "" {
		if u, err := url.Parse(c.OTLPEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("otlp endpoint %q must be an http or https URL", c.OTLPEndpoint)
		}
	}
	if c.AuditTrackFrom < 0 {
		bad("audit_track_from %d must not be negative (0: track every layer)", c.AuditTrackFrom)
	}
	if c.AuditMaxBytes < 0 {
		bad("audit_max_bytes %d must not be negative (0: default)", c.AuditMaxBytes)
	}
	if c.ConnectorsFile != "" && !filepath.IsAbs(c.ConnectorsFile) {
		bad("connectors file %q must be an absolute path", c.ConnectorsFile)
	}
	r := c.DefaultResources
	if r.CPUs <= 0 || r.MemoryBytes <= 0 || r.PidsMax <= 0 {
		bad("default resources must be positive (cpus %v, memory %d, pids %d)", r.CPUs, r.MemoryBytes, r.PidsMax)
	}
	switch c.StorageDriver {
	case "", "auto", "copy", "reflink":
	default:
		bad("storage driver %q must be auto, copy or reflink", c.StorageDriver)
	}
	if c.ImplicitCheckpointsKeep < 0 {
		bad("implicit_checkpoints_keep %d must not be negative (0: no limit)", c.ImplicitCheckpointsKeep)
	}
	if c.ImplicitCheckpointsMaxAgeSeconds < 0 || c.ImplicitCheckpointsMaxAgeSeconds > maxImplicitCheckpointAge {
		bad("implicit_checkpoints_max_age_seconds %d must be between 0 (no limit) and %d", c.ImplicitCheckpointsMaxAgeSeconds, maxImplicitCheckpointAge)
	}
	if c.MaxLayerDepth < 0 || c.MaxLayerDepth > 500 {
		bad("max layer depth %d must be between 1 and 500 (0: default)", c.MaxLayerDepth)
	}
	if c.Prespawn < 0 || c.Prespawn > maxPrespawn {
		bad("prespawn %d must be between 0 and %d", c.Prespawn, maxPrespawn)
	}
	if _, err := c.EgressPermitRules(); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateLimits()...)
	errs = append(errs, c.validateTCP()...)
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log format %q must be text or json", c.LogFormat)
	}
	return errors.Join(errs...)
}

// ParseLogLevel parses debug, info, warn or error.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil || s == "" {
		return 0, fmt.Errorf("log level %q must be debug, info, warn or error: %w", s, errdefs.ErrInvalidArgument)
	}
	return l, nil
}

// NewLogger returns a slog.Logger writing to w in the configured format and
// level. Call it after Validate.
func (c *Config) NewLogger(w io.Writer) *slog.Logger {
	lvl, _ := ParseLogLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// LoadAPIKeys reads APIKeysFile into APIKeys. The file must not be readable
// or writable by others (0600 or 0640); an empty key list is an error.
func (c *Config) LoadAPIKeys() error {
	if c.APIKeysFile == "" {
		return nil
	}
	f, err := os.Open(c.APIKeysFile)
	if err != nil {
		return fmt.Errorf("opening API keys file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("opening API keys file: %w", err)
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return fmt.Errorf("API keys file %s is accessible by others (mode %#o); chmod 600 it: %w", c.APIKeysFile, fi.Mode().Perm(), errdefs.ErrPermissionDenied)
	}
	keys, err := ParseAPIKeys(f)
	if err != nil {
		return fmt.Errorf("API keys file %s: %w", c.APIKeysFile, err)
	}
	c.APIKeys = keys
	return nil
}

// ParseAPIKeys reads one key per line, skipping blank lines and # comments.
// Keys shorter than 16 bytes or containing whitespace are rejected.
func ParseAPIKeys(r io.Reader) ([]string, error) {
	var keys []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < 16 || strings.ContainsAny(line, " \t") {
			// Never echo the key itself.
			return nil, fmt.Errorf("line %d: a key must be at least 16 characters without spaces: %w", n, errdefs.ErrInvalidArgument)
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading API keys: %w", err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no API keys: %w", errdefs.ErrInvalidArgument)
	}
	return keys, nil
}

// Redacted returns a copy of c safe to log or show: every API key is
// replaced by "REDACTED".
func (c *Config) Redacted() Config {
	r := *c
	if len(c.APIKeys) > 0 {
		r.APIKeys = make([]string, len(c.APIKeys))
		for i := range r.APIKeys {
			r.APIKeys[i] = "REDACTED"
		}
	}
	r.AllowedHosts = append([]string(nil), c.AllowedHosts...)
	return r
}

// LogValue makes a *Config log itself redacted through slog.
func (c *Config) LogValue() slog.Value {
	r := c.Redacted()
	return slog.GroupValue(
		slog.String("data_dir", r.DataDir),
		slog.String("socket", r.SocketPath),
		slog.String("tcp", r.TCPAddr),
		slog.Int("api_keys", len(r.APIKeys)),
		slog.Any("uid_map", [2]uint32{r.UIDMapBase, r.UIDMapSize}),
		slog.Any("gid_map", [2]uint32{r.GIDMapBase, r.GIDMapSize}),
		slog.String("default_template", r.DefaultTemplate),
		slog.String("log_level", r.LogLevel),
		slog.String("log_format", r.LogFormat),
	)
}

var _ slog.LogValuer = (*Config)(nil)

// CPUYieldOn reports whether the CPU yield policy is on (the default).
func (c *Config) CPUYieldOn() bool { return c.CPUYield == nil || *c.CPUYield }

// LegacyCgroupParent is the parent every daemon shared before parents were
// derived from the data dir: sandboxes a daemon made there are still
// recovered, nothing else is made or swept there.
const LegacyCgroupParent = "agentbox"

// DerivedCgroupParent is the cgroup parent of a daemon whose data dir is
// dataDir (absolute, symlinks resolved by the caller): "agentbox-" and the
// first 12 hex digits of the SHA-256 of the cleaned path. It is stable
// across restarts, so a restarted daemon finds its sandboxes again.
func DerivedCgroupParent(dataDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return LegacyCgroupParent + "-" + hex.EncodeToString(sum[:6])
}

// EffectiveCgroupParent is CgroupParent when set, else the parent derived
// from dataDir (the data dir as the daemon resolved it).
func (c *Config) EffectiveCgroupParent(dataDir string) string {
	if c.CgroupParent != "" {
		return c.CgroupParent
	}
	return DerivedCgroupParent(dataDir)
}

// TCPPort is the port of TCPAddr; false when TCPAddr is empty or not
// host:port with a numeric port.
func (c *Config) TCPPort() (int, bool) { return portOf(c.TCPAddr) }

// MetricsPort is the port of MetricsAddr, as TCPPort is of TCPAddr.
func (c *Config) MetricsPort() (int, bool) { return portOf(c.MetricsAddr) }

// MetricsListenAddr is MetricsAddr with an empty host made 127.0.0.1.
func (c *Config) MetricsListenAddr() string {
	host, port, err := net.SplitHostPort(c.MetricsAddr)
	if err != nil || host != "" {
		return c.MetricsAddr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// portOf is the numeric port of host:port addr; false when it has none.
func portOf(addr string) (int, bool) {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil || ps == "" {
		return 0, false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return 0, false
	}
	return port, true
}

// EgressPermitRules parses EgressPermit (egress.ParsePermit). Validate
// refuses a config where it fails.
func (c *Config) EgressPermitRules() ([]*egress.Rule, error) {
	var rules []*egress.Rule
	for _, s := range c.EgressPermit {
		r, err := egress.ParsePermit(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// validServiceDomain reports whether d is a DNS name of at least two
// labels (letters, digits, hyphens; no wildcard), optionally with a
// :port.
func validServiceDomain(d string) bool {
	host := d
	if h, p, err := net.SplitHostPort(d); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return false
		}
		host = h
	}
	labels := strings.Split(host, ".")
	if len(host) > 253 || len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range []byte(l) {
			if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// ServicePublicURL is the base of service URLs: PublicURL, or one derived
// from TCPAddr and TLS (an unspecified host is 127.0.0.1); "" without TCP.
func (c *Config) ServicePublicURL() string {
	if c.PublicURL != "" {
		return strings.TrimSuffix(c.PublicURL, "/")
	}
	if c.TCPAddr == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(c.TCPAddr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	if c.TLS() {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// AuditKey is the file of the flight recorder's signing key: AuditKeyFile,
// or audit.key beside SecretsKeyFile.
func (c *Config) AuditKey() string {
	if c.AuditKeyFile != "" {
		return c.AuditKeyFile
	}
	return filepath.Join(filepath.Dir(c.SecretsKeyFile), "audit.key")
}
