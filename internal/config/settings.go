package config

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// setting binds one field of Config to its flag of `agentbox serve` and
// its environment variable. The table settings is the one place where a
// field meets them: BindFlags, ApplyEnv and the reference docs/CONFIG.md
// are made from it.
type setting struct {
	// Key is the field's JSON key (Config's json tags).
	Key string
	// Flag is the flag of `agentbox serve`, without "--"; "" for none.
	Flag string
	// Env is the environment variable ApplyEnv reads; "" for none.
	Env string
	// Usage is the flag's help text; BindFlags adds the variable.
	Usage string
	// field returns a pointer to the field of c: *string, *[]string, *int,
	// *int64, *float64, *bool or *map[string]int. Its type says how the
	// flag and the variable parse (see bindFlag and applyEnvValue).
	field func(c *Config) any
}

// settings are every setting with a flag or an environment variable, in
// the order of `agentbox serve --help`.
var settings = []setting{
	{Key: "data_dir", Flag: "data-dir", Env: EnvDataDir, Usage: "data directory",
		field: func(c *Config) any { return &c.DataDir }},
	{Key: "socket_path", Flag: "socket", Env: EnvSocket, Usage: "unix socket of the API",
		field: func(c *Config) any { return &c.SocketPath }},
	{Key: "tcp_addr", Flag: "tcp", Env: EnvTCP, Usage: "also serve the API on this TCP host:port, with API keys (an empty variable turns TCP off)",
		field: func(c *Config) any { return &c.TCPAddr }},
	{Key: "metrics_addr", Flag: "metrics-addr", Env: EnvMetricsAddr, Usage: "serve /metrics, /healthz and /readyz without credentials on this host:port (\":9464\" binds 127.0.0.1; empty: off, /metrics is then on the API only)",
		field: func(c *Config) any { return &c.MetricsAddr }},
	{Key: "api_keys_file", Flag: "api-keys-file", Env: EnvAPIKeysFile, Usage: "file of admin API keys for the TCP listener, one per line; tenants' keys are created with \"agentbox key create\"",
		field: func(c *Config) any { return &c.APIKeysFile }},
	{Key: "allowed_hosts", Flag: "allowed-host", Usage: "Host header values accepted on TCP: host or host:port, * for any (repeatable; default: IP literals and localhost only)",
		field: func(c *Config) any { return &c.AllowedHosts }},
	{Key: "service_domain", Flag: "service-domain", Env: EnvServiceDomain, Usage: "serve service URLs also by host, {port}-{id}.DOMAIN on the TCP listener (a wildcard DNS name pointing at it; DOMAIN may end in :port)",
		field: func(c *Config) any { return &c.ServiceDomain }},
	{Key: "public_url", Flag: "public-url", Env: EnvPublicURL, Usage: "the TCP listener's address as clients reach it, scheme://host[:port], the base of service URLs (default: from --tcp)",
		field: func(c *Config) any { return &c.PublicURL }},
	{Key: "tls_cert_file", Flag: "tls-cert", Env: EnvTLSCert, Usage: "PEM certificate (chain) of the TCP listener, which then speaks only TLS",
		field: func(c *Config) any { return &c.TLSCertFile }},
	{Key: "tls_key_file", Flag: "tls-key", Env: EnvTLSKey, Usage: "PEM private key of --tls-cert",
		field: func(c *Config) any { return &c.TLSKeyFile }},
	{Key: "insecure_tcp", Flag: "insecure-tcp", Env: EnvInsecureTCP, Usage: "allow --tcp on a non-loopback address without TLS, API keys in clear text (variable: 1 or true)",
		field: func(c *Config) any { return &c.InsecureTCP }},
	{Key: "max_conns", Flag: "max-conns", Usage: "TCP connections at most (0: from the open-file limit, keeping a reserve for the unix socket and sandboxes)",
		field: func(c *Config) any { return &c.MaxConns }},
	{Key: "max_conns_per_addr", Flag: "max-conns-per-addr", Usage: "TCP connections per client address (IPv6: per /64) at most (0: derived)",
		field: func(c *Config) any { return &c.MaxConnsPerAddr }},
	{Key: "tcp_request_rate", Flag: "tcp-rate", Usage: "requests per second each tenant (and the admin keys) may make on TCP on average; over it: 429 with Retry-After (0: no limit)",
		field: func(c *Config) any { return &c.TCPRequestRate }},
	{Key: "tcp_request_burst", Flag: "tcp-burst", Usage: "requests a tenant may make on TCP at once, above --tcp-rate",
		field: func(c *Config) any { return &c.TCPRequestBurst }},
	{Key: "e2b_addr", Flag: "e2b", Env: EnvE2BAddr, Usage: "also serve the E2B-compatible API (docs/E2B.md) on this host:port, with the TCP listener's API keys, TLS and limits",
		field: func(c *Config) any { return &c.E2BAddr }},
	{Key: "e2b_templates", Flag: "e2b-template", Usage: "E2B template name mapped to an agentbox template, E2BNAME=TEMPLATE (repeatable; defaults: base=debian, code-interpreter-v1=code-interpreter)",
		field: func(c *Config) any { return &c.E2BTemplates }},
	{Key: "default_template", Flag: "default-template", Usage: "template of sandboxes that name none",
		field: func(c *Config) any { return &c.DefaultTemplate }},
	{Key: "runtime", Flag: "runtime", Env: EnvRuntime, Usage: "isolation backend of sandboxes whose create names none",
		field: func(c *Config) any { return &c.Runtime }},
	{Key: "runsc", Flag: "runsc", Env: EnvRunsc, Usage: "runsc binary of the gvisor backend (default: scripts/install-deps.sh's cache, then $PATH; none: no gvisor backend)",
		field: func(c *Config) any { return &c.Runsc }},
	{Key: "gvisor_platform", Flag: "gvisor-platform", Env: EnvGvisorPlatform, Usage: "runsc platform of the gvisor backend: systrap (default), ptrace, or kvm where /dev/kvm works",
		field: func(c *Config) any { return &c.GvisorPlatform }},
	{Key: "secrets_key_file", Flag: "secrets-key-file", Env: EnvSecretsKeyFile, Usage: "master key of the secret store and run tokens, outside the data dir; created when missing",
		field: func(c *Config) any { return &c.SecretsKeyFile }},
	{Key: "audit_key_file", Flag: "audit-key-file", Env: EnvAuditKeyFile, Usage: "ed25519 key signing the flight recorder's chain heads, outside the data dir; created when missing (default: audit.key beside the secrets key file)",
		field: func(c *Config) any { return &c.AuditKeyFile }},
	{Key: "audit_retention_seconds", Flag: "audit-retention-seconds", Usage: "seconds a deleted sandbox's flight record is kept",
		field: func(c *Config) any { return &c.AuditRetentionSeconds }},
	{Key: "audit_max_bytes", Flag: "audit-max-bytes", Usage: "bytes of flight record kept per sandbox; events beyond are counted in a \"dropped\" event",
		field: func(c *Config) any { return &c.AuditMaxBytes }},
	{Key: "otlp_endpoint", Flag: "otlp-endpoint", Env: EnvOTLPEndpoint, Usage: "OTLP/HTTP traces URL of an OpenTelemetry collector the flight recorder exports to (a run is a span; e.g. http://127.0.0.1:4318/v1/traces)",
		field: func(c *Config) any { return &c.OTLPEndpoint }},
	{Key: "audit_disabled", Flag: "no-audit", Usage: "turn the flight recorder off",
		field: func(c *Config) any { return &c.AuditDisabled }},
	{Key: "audit_walk", Flag: "audit-walk", Usage: "list each run's writable layer before and after it instead of following it with fanotify (the flight recorder's file changes)",
		field: func(c *Config) any { return &c.AuditWalk }},
	{Key: "audit_track_from", Flag: "audit-track-from", Usage: "entries from which a writable layer is followed with fanotify rather than listed before and after each run (0: every layer)",
		field: func(c *Config) any { return &c.AuditTrackFrom }},
	{Key: "console_disabled", Flag: "no-console", Usage: "do not serve the web console at /ui/",
		field: func(c *Config) any { return &c.ConsoleDisabled }},
	{Key: "connectors_file", Flag: "connectors-file", Env: EnvConnectorsFile, Usage: "JSON array of API bridge connectors [{name, url, secret, header, format}]",
		field: func(c *Config) any { return &c.ConnectorsFile }},
	{Key: "egress_permit", Flag: "egress-permit", Env: EnvEgressPermit, Usage: "internal address range the egress proxy may dial, CIDR or ADDR with an optional :PORT or :* (repeatable; the variable is comma-separated); loopback, link-local, private, CGNAT, ULA and the host's own addresses are unreachable from sandboxes otherwise, whatever their rules say (127.0.0.1:8080 lets sandboxes allowing host.agentbox.internal:8080 reach the host's service there)",
		field: func(c *Config) any { return &c.EgressPermit }},
	{Key: "egress_hosts_file", Flag: "egress-hosts-file", Env: EnvEgressHostsFile, Usage: "hosts(5)-style file of names the egress proxy resolves without DNS (host.agentbox.internal, the host's loopback as sandboxes name it, resolves to 127.0.0.1 unless the file names it)",
		field: func(c *Config) any { return &c.EgressHostsFile }},
	{Key: "egress_ca_file", Flag: "egress-ca-file", Env: EnvEgressCAFile, Usage: "PEM roots the egress proxy trusts for upstream certificates besides the system's",
		field: func(c *Config) any { return &c.EgressCAFile }},
	{Key: "warm_pools", Flag: "warm-pool", Env: EnvWarmPools, Usage: "paused sandboxes kept ready per template, e.g. busybox=2, on a backend other than the template's default with TEMPLATE:RUNTIME, e.g. busybox:gvisor=1 (repeatable; the variable is comma-separated)",
		field: func(c *Config) any { return &c.WarmPools }},
	{Key: "prespawn", Flag: "prespawn", Env: EnvPrespawn, Usage: "guests kept started ahead of need, so a create skips their start-up (hosts with cgroup v1 controllers; 0: none)",
		field: func(c *Config) any { return &c.Prespawn }},
	{Key: "default_resources.disk_bytes", Flag: "default-disk-bytes", Usage: "writable layer size of sandboxes that ask for none (0: no default disk limit)",
		field: func(c *Config) any { return &c.DefaultResources.DiskBytes }},
	{Key: "default_resources.disk_inodes", Flag: "default-disk-inodes", Usage: "writable layer inodes of sandboxes that ask for none (scaled down for a smaller disk_bytes)",
		field: func(c *Config) any { return &c.DefaultResources.DiskInodes }},
	{Key: "max_disk_bytes", Flag: "max-disk-bytes", Usage: "most disk_bytes a tenant's sandbox may have (0: the default's)",
		field: func(c *Config) any { return &c.MaxDiskBytes }},
	{Key: "max_disk_inodes", Flag: "max-disk-inodes", Usage: "most disk_inodes a tenant's sandbox may have (0: the default's)",
		field: func(c *Config) any { return &c.MaxDiskInodes }},
	{Key: "default_resources.open_files", Flag: "default-open-files", Usage: "RLIMIT_NOFILE of sandboxes that ask for none (0: inherited)",
		field: func(c *Config) any { return &c.DefaultResources.OpenFiles }},
	{Key: "storage_driver", Flag: "storage-driver", Env: EnvStorageDriver, Usage: "layer storage driver: auto, copy or reflink",
		field: func(c *Config) any { return &c.StorageDriver }},
	{Key: "max_layer_depth", Flag: "max-layer-depth", Env: EnvMaxLayerDepth, Usage: "layer chains deeper than this are squashed (0: 32)",
		field: func(c *Config) any { return &c.MaxLayerDepth }},
	{Key: "implicit_checkpoints_keep", Flag: "implicit-checkpoints-keep", Env: EnvImplicitCheckpointsKeep, Usage: "checkpoints the daemon takes on its own (exec --checkpoint, fork, merge) kept per sandbox, newest first; older ones are pruned unless a live sandbox runs on or was forked from them (0: no limit)",
		field: func(c *Config) any { return &c.ImplicitCheckpointsKeep }},
	{Key: "implicit_checkpoints_max_age_seconds", Flag: "implicit-checkpoints-max-age-seconds", Env: EnvImplicitCheckpointsMaxAge, Usage: "seconds after which a checkpoint the daemon took on its own is pruned, unless a live sandbox runs on or was forked from it (0: no limit)",
		field: func(c *Config) any { return &c.ImplicitCheckpointsMaxAgeSeconds }},
	{Key: "cgroup_parent", Flag: "cgroup-parent", Env: EnvCgroupParent, Usage: "cgroup under which this daemon alone makes its sandboxes' cgroups (default: derived from the data dir)",
		field: func(c *Config) any { return &c.CgroupParent }},
	{Key: "log_level", Flag: "log-level", Env: EnvLogLevel, Usage: "debug, info, warn or error",
		field: func(c *Config) any { return &c.LogLevel }},
	{Key: "log_format", Flag: "log-format", Env: EnvLogFormat, Usage: "text or json",
		field: func(c *Config) any { return &c.LogFormat }},
}

// BindFlags defines the flags of `agentbox serve` on fs, each bound to its
// field of c with c's current value as the default (call it after Default
// and ApplyEnv: a flag given wins over the environment).
func (c *Config) BindFlags(fs *pflag.FlagSet) {
	for _, s := range settings {
		if s.Flag == "" {
			continue
		}
		usage := s.Usage
		if s.Env != "" {
			usage += " (env " + s.Env + ")"
		}
		bindFlag(fs, s.Flag, usage, s.field(c))
	}
}

func bindFlag(fs *pflag.FlagSet, name, usage string, p any) {
	switch p := p.(type) {
	case *string:
		fs.StringVar(p, name, *p, usage)
	case *[]string:
		fs.StringSliceVar(p, name, *p, usage)
	case *int:
		fs.IntVar(p, name, *p, usage)
	case *int64:
		fs.Int64Var(p, name, *p, usage)
	case *float64:
		fs.Float64Var(p, name, *p, usage)
	case *bool:
		fs.BoolVar(p, name, *p, usage)
	case *map[string]int:
		fs.StringToIntVar(p, name, *p, usage)
	default:
		panic(fmt.Sprintf("config: setting --%s: no flag for a field of type %T", name, p))
	}
}

// ApplyEnv overrides fields from the AGENTBOX_* environment variables that
// are set (an empty AGENTBOX_TCP turns TCP off). A number that does not
// parse becomes -1, which Validate refuses; a list is comma-separated,
// blank entries skipped; a boolean is on for "1" or "true".
func (c *Config) ApplyEnv() {
	for _, s := range settings {
		if s.Env == "" {
			continue
		}
		if v, ok := os.LookupEnv(s.Env); ok {
			applyEnvValue(s.field(c), v)
		}
	}
}

func applyEnvValue(p any, v string) {
	switch p := p.(type) {
	case *string:
		*p = v
	case *[]string:
		*p = nil
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				*p = append(*p, e)
			}
		}
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -1 // refused by Validate
		}
		*p = n
	case *bool:
		*p = v == "1" || strings.EqualFold(v, "true")
	case *map[string]int:
		*p = parseWarmPools(v)
	default:
		panic(fmt.Sprintf("config: no environment parsing for a field of type %T", p))
	}
}

// Markdown renders the settings as the reference table of docs/CONFIG.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| Setting (JSON key) | Flag of `agentbox serve` | Environment variable | Default | Meaning |\n|---|---|---|---|---|\n")
	def := Default()
	for _, s := range settings {
		flag, env := "", ""
		if s.Flag != "" {
			flag = "`--" + s.Flag + "`"
		}
		if s.Env != "" {
			env = "`" + s.Env + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", s.Key, flag, env, defaultText(s.field(def)), strings.ReplaceAll(s.Usage, "|", "\\|"))
	}
	return b.String()
}

func defaultText(p any) string {
	var v string
	switch p := p.(type) {
	case *string:
		v = *p
	case *[]string:
		v = strings.Join(*p, ",")
	case *int:
		v = strconv.Itoa(*p)
	case *int64:
		v = strconv.FormatInt(*p, 10)
	case *float64:
		v = strconv.FormatFloat(*p, 'g', -1, 64)
	case *bool:
		v = strconv.FormatBool(*p)
	case *map[string]int:
		for _, k := range slices.Sorted(maps.Keys(*p)) {
			v += k + "=" + strconv.Itoa((*p)[k]) + " "
		}
	}
	if v == "" {
		return ""
	}
	return "`" + strings.TrimSpace(v) + "`"
}
