package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// parseKV turns K=V strings into a map; it rejects entries without "=" or
// with an empty key.
func parseKV(what string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid %s %q: want KEY=VALUE", what, kv)
		}
		m[k] = v
	}
	return m, nil
}

// formatKV renders a map as sorted "k=v,k=v".
func formatKV(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// parseBytes parses a size such as "512M", "1.5G", "64KiB" or "1048576"
// (binary units; B, K, M, G, T, with optional "i"/"iB"/"B" suffixes).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := 1.0
	if n := len(t); n > 0 {
		if i := strings.IndexByte("KMGT", t[n-1]); i >= 0 {
			mult = math.Pow(1024, float64(i+1))
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f*mult, 0) || f*mult > math.MaxInt64 {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional unit K, M, G or T", s)
	}
	return int64(f * mult), nil
}

// specFlags are the flags that describe a sandbox (create, run).
type specFlags struct {
	template string
	runtime  string
	env      []string
	labels   []string
	cpus     float64
	memory   string
	pids     int64
	timeout  time.Duration
	hostname string
	allow    []string // egress allow rules; any turns on network mode egress
	deny     []string
	// lifecycle (cmd/agentbox/lifecycle.go)
	name, lifecycle                         string
	pauseAfter, hibernateAfter, deleteAfter string
	idleIgnoresBackground                   bool
	// limits (cmd/agentbox/limits.go)
	limits limitFlags
}

func (f *specFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.template, "template", "", "template to start from (default: the daemon's)")
	fs.StringVar(&f.runtime, "runtime", "", "isolation backend to run on, one of those \"agentbox info\" lists (default: the daemon's)")
	fs.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for every command (repeatable)")
	fs.StringArrayVarP(&f.labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	fs.Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores, e.g. 0.5")
	fs.StringVarP(&f.memory, "memory", "m", "", "memory limit, e.g. 512M or 2G")
	fs.Int64Var(&f.pids, "pids", 0, "maximum number of processes and threads")
	fs.DurationVar(&f.timeout, "timeout", 0, "lifetime after which the sandbox is deleted, e.g. 10m")
	fs.StringVar(&f.hostname, "hostname", "", "hostname inside the sandbox")
	fs.StringArrayVar(&f.allow, "allow-host", nil, "turn on egress through the proxy and allow HOST[:PORT|:*] (*.example.com wildcards, IPs, CIDRs; internal addresses only where the daemon's --egress-permit allows; the host's loopback is host.agentbox.internal, 127.0.0.1 inside is the sandbox's own; repeatable)")
	fs.StringArrayVar(&f.deny, "deny-host", nil, "deny HOST[:PORT] in egress mode, overriding allows (repeatable)")
	fs.StringVar(&f.name, "name", "", "unique name; creating an existing name returns that sandbox")
	fs.StringVar(&f.lifecycle, "lifecycle", "", "session (default: deleted when idle) or persistent (kept, hibernated when idle)")
	fs.StringVar(&f.pauseAfter, "pause-after", "", "pause after this much idle time, e.g. 5m, or never")
	fs.StringVar(&f.hibernateAfter, "hibernate-after", "", "hibernate after this much idle time, or never")
	fs.StringVar(&f.deleteAfter, "delete-after", "", "delete after this much idle time, or never")
	fs.BoolVar(&f.idleIgnoresBackground, "idle-ignores-background", false, "let the idle steps apply while background processes run (exec -d, or left running by a command; by default a running background process keeps the sandbox awake, and one paused by hand is not hibernated or deleted while it held one)")
	f.limits.register(cmd)
}

func (f *specFlags) spec() (agentbox.SandboxSpec, error) {
	var spec agentbox.SandboxSpec
	var err error
	if spec.Env, err = parseKV("--env", f.env); err != nil {
		return spec, err
	}
	if spec.Labels, err = parseKV("--label", f.labels); err != nil {
		return spec, err
	}
	if f.memory != "" {
		if spec.Resources.MemoryBytes, err = parseBytes(f.memory); err != nil {
			return spec, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.cpus < 0 || f.pids < 0 || f.timeout < 0 {
		return spec, fmt.Errorf("--cpus, --pids and --timeout must not be negative")
	}
	spec.Template, spec.Hostname, spec.Runtime = f.template, f.hostname, f.runtime
	spec.Resources.CPUs, spec.Resources.PidsMax = f.cpus, f.pids
	if err := f.limits.apply(&spec.Resources); err != nil {
		return spec, err
	}
	spec.TimeoutSeconds = int64(math.Ceil(f.timeout.Seconds()))
	if len(f.allow) > 0 || len(f.deny) > 0 {
		spec.Network = &agentbox.NetworkSpec{Mode: "egress", Allow: f.allow, Deny: f.deny}
	}
	spec.Name, spec.Lifecycle = f.name, f.lifecycle
	var idle agentbox.IdlePolicy
	for _, p := range []struct {
		flag, v string
		out     *int64
	}{{"pause-after", f.pauseAfter, &idle.PauseAfterSeconds}, {"hibernate-after", f.hibernateAfter, &idle.HibernateAfterSeconds}, {"delete-after", f.deleteAfter, &idle.DeleteAfterSeconds}} {
		if *p.out, err = idleSeconds(p.flag, p.v); err != nil {
			return spec, err
		}
	}
	idle.IgnoreBackground = f.idleIgnoresBackground
	if idle != (agentbox.IdlePolicy{}) {
		spec.Idle = &idle
	}
	return spec, nil
}

// humanDuration renders d roughly: "45 seconds", "3 minutes", "2 hours", "5 days".
func humanDuration(d time.Duration) string {
	plural := func(n int, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return strconv.Itoa(n) + " " + unit + "s"
	}
	switch {
	case d < time.Minute:
		return plural(int(d.Seconds()), "second")
	case d < time.Hour:
		return plural(int(d.Minutes()), "minute")
	case d < 48*time.Hour:
		return plural(int(d.Hours()), "hour")
	default:
		return plural(int(d.Hours()/24), "day")
	}
}

// humanBytes renders n in binary units: "2.0MiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
